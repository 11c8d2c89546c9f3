"""How busy each pytest worker was, from the lines tests/conftest.py writes: the suite
lasts as long as its busiest worker, so this says which tests to shorten or move.

On the kind of CPU the pair below was measured on (a 2-core AMD EPYC with AVX-512 bf16
units) it also estimates the suite on the slowest CPU seen, a 2-core AVX2-only EPYC, by
the ratio of one tree's pytest time on both: the same commit, fresh clones, two workers.
Scaling each test's vLLM work instead (a prefill 14x, a decode 1.6x, issue #28) read
35 minutes for a suite that the AVX2 machine ran in 15-17: those factors are bf16's, and
the session's engines compute in float32 (tests/session_engine.py: a 512-token prefill
1.1 s there, not 6.8), while most of the suite is Python and Textual, slower there too.
Each test's vLLM work (tests/work_meter.py: prefill and decode seconds, prompt tokens) is
still listed beside its time: it says where prompt tokens can be cut.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# de60889, `.ci/run` in a fresh clone, pytest's own "in N s" figure on each machine.
PAIR_COMMIT = "de60889"
SLOW_PYTEST_S = 17 * 60 + 18  # the AVX2-only EPYC, 2026-12-03 (docs/testing.md)
FAST_PYTEST_S = 11 * 60 + 19  # the AVX-512 bf16 EPYC, 2026-12-07 (678.9 s)
SLOW_OVER_FAST = SLOW_PYTEST_S / FAST_PYTEST_S
PAIRED_CPU = ("AMD EPYC", "avx512_bf16")  # the model name and the flag of the fast one


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
    slowest: list[tuple[float, int, str]] = field(default_factory=list)


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
        w.slowest.append((took, int(parts[6]) if len(parts) == 8 else 0, parts[3]))
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
    """The suite on the AVX2-only EPYC, worker by worker, and how it was reckoned."""
    workers = read(lines)
    if not workers:
        return []
    start = min(w.first for w in workers.values())
    out = [
        f"on the AVX2-only EPYC: {SLOW_OVER_FAST:.2f} x here ({PAIR_COMMIT}'s pytest took "
        f"{SLOW_PYTEST_S} s there and {FAST_PYTEST_S} s on this kind of CPU, fresh clones):"
    ]
    spans = []
    for name, w in sorted(workers.items()):
        span = (w.last - start) * SLOW_OVER_FAST
        spans.append(span)
        out.append(
            f"{name}: {w.last - start:.0f} s here -> about {span:.0f} s (vLLM work here: "
            f"prefill {w.prefill_s:.0f} s of {w.prefill_tokens:,} prompt tokens, decode "
            f"{w.decode_s:.0f} s; {w.own} tests with vLLM in their own subprocess, "
            f"{w.own_s:.0f} s)"
        )
    out.append(f"suite: about {max(spans) / 60:.1f} min of pytest on the slow CPU")
    return out


def slowest(lines: list[str]) -> list[str]:
    """The 20 slowest tests here, with the prompt tokens each sent to a counted vLLM."""
    ranked = sorted((t for w in read(lines).values() for t in w.slowest), reverse=True)[:20]
    out = ["the 20 slowest here (seconds, prompt tokens, test):"]
    out += [f"  {took:6.1f} s {tokens:6,} {test}" for took, tokens, test in ranked]
    return out


def paired_cpu() -> bool:
    """Whether this CPU is the kind the pair's fast half was measured on."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1] for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return PAIRED_CPU[0] in model and PAIRED_CPU[1] in flags


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
    for row in slowest(lines):
        print(f"ci: {row}")
    if paired_cpu():
        for row in slow_cpu_estimate(lines):
            print(f"ci: {row}")
    else:
        print(
            "ci: no estimate for the AVX2-only EPYC: the suite was timed on both only beside "
            f"an {' with '.join(PAIRED_CPU)} (scripts/test_timeline.py)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
