"""How busy each pytest worker was, from the lines tests/conftest.py writes: the suite
lasts as long as its busiest worker, so this says which tests to shorten or move.

On a CPU with AVX-512 bf16 (or AMX) units it also estimates the suite on the slowest CPU
seen, an AVX2-only one, where a prefill is PREFILL_SLOWER times slower and a decode step
DECODE_SLOWER times (issue #28: a 512-token prefill 5.8 s there, 14x this kind's; decode
1.6x). Each test's vLLM work (tests/work_meter.py: its prefill and decode seconds) is
scaled by those, the rest of its time kept: a worker's span grows by its tests' extra.
vLLM started in a test's own subprocess is not counted: those tests' time is said apart.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

PREFILL_SLOWER = 14.0
DECODE_SLOWER = 1.6
FAST_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass
class Worker:
    tests: int = 0
    busy_s: float = 0.0
    first: float = float("inf")
    last: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    own_s: float = 0.0  # in tests that start vLLM in a subprocess (not counted)
    own: int = 0
    slowest: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def extra_s(self) -> float:
        """What the slow CPU adds: the vLLM work counted, scaled."""
        return self.prefill_s * (PREFILL_SLOWER - 1) + self.decode_s * (DECODE_SLOWER - 1)


def read(lines: list[str]) -> dict[str, Worker]:
    workers: dict[str, Worker] = defaultdict(Worker)
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) not in (4, 8):
            continue
        w = workers[parts[0]]
        began, took = float(parts[1]), float(parts[2])
        w.tests += 1
        w.busy_s += took
        w.first = min(w.first, began)
        w.last = max(w.last, began + took)
        if len(parts) == 8:
            prefill, decode = float(parts[4]), float(parts[5])
            w.prefill_s += prefill
            w.decode_s += decode
            w.prefill_tokens += int(parts[6])
            if parts[7] == "1":
                w.own += 1
                w.own_s += took
            extra = prefill * (PREFILL_SLOWER - 1) + decode * (DECODE_SLOWER - 1)
            w.slowest.append((took + extra, took, parts[3]))
    return workers


def summary(lines: list[str]) -> list[str]:
    workers = read(lines)
    start = min((w.first for w in workers.values()), default=0.0)
    return [
        f"{name}: {w.tests} tests, busy {w.busy_s:.0f} s, "
        f"from {w.first - start:.0f} s to {w.last - start:.0f} s"
        for name, w in sorted(workers.items())
    ]


def slow_cpu_estimate(lines: list[str]) -> list[str]:
    """The suite on an AVX2-only CPU, worker by worker, and how it was reckoned."""
    workers = read(lines)
    if not workers or not any(w.slowest for w in workers.values()):
        return []
    start = min(w.first for w in workers.values())
    out = [
        f"on an AVX2-only CPU (prefill {PREFILL_SLOWER:g}x, decode {DECODE_SLOWER:g}x slower "
        "than here), estimated from each test's vLLM work:"
    ]
    spans = []
    for name, w in sorted(workers.items()):
        span = w.last - start + w.extra_s
        spans.append(span)
        out.append(
            f"{name}: {w.last - start:.0f} s here -> about {span:.0f} s (prefill "
            f"{w.prefill_s:.0f} s of {w.prefill_tokens:,} prompt tokens, decode "
            f"{w.decode_s:.0f} s; {w.own} tests with vLLM in their own subprocess, "
            f"{w.own_s:.0f} s, counted as they ran here)"
        )
    out.append(f"suite: about {max(spans) / 60:.1f} min of pytest on the slow CPU")
    ranked = sorted((t for w in workers.values() for t in w.slowest), reverse=True)[:20]
    out.append("the 20 slowest there (estimate, here, test):")
    out += [f"  {slow:6.1f} s {here:6.1f} s {test}" for slow, here, test in ranked]
    return out


def fast_cpu() -> bool:
    """Whether this CPU has the bf16 units the slow one lacks (the estimate is relative)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")),
        [],
    )
    return any(f in flags for f in FAST_FLAGS)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: test_timeline.py TIMELINE_FILE", file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    if not path.exists():
        print(f"no timeline at {path}")
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    for row in summary(lines):
        print(f"ci: worker {row}")
    if fast_cpu():
        for row in slow_cpu_estimate(lines):
            print(f"ci: {row}")
    else:
        print("ci: this CPU has no AVX-512 bf16 units: its times are the slow CPU's own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
