"""`--find-max`: the highest load whose requests meet the objectives, by a bounded search.

A probe passes when the point completed without failures or over-saturation and each
objective holds at its 99th percentile (p99 TTFT, TPOT, E2EL at most the `--goodput`
limits). The search doubles the load from the start until a probe fails, then halves the
gap between the last pass and the first failure, for at most `max_probes` points; the
answer names the failing point's reason, with the cause the engine's steps show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.load_runner import MAX_CONCURRENCY, MAX_RATE, LoadLevel

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from bench.load_result import LoadMode, LoadPoint
    from bench.load_runner import LoadRunner

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}


@dataclass(frozen=True)
class Probe:
    level: float
    passed: bool
    reason: str  # why it failed; what it met when it passed
    point: LoadPoint


@dataclass(frozen=True)
class MaxFound:
    mode: LoadMode
    best: float | None  # None: even the lowest probe failed
    probes: tuple[Probe, ...]
    bound: str = ""
    """Why the search went no higher than it did, when something other than the limit
    of kvscope's runner held it ("--num-prompts 4 keeps at most 4 requests in flight")."""

    @property
    def next_failure(self) -> Probe | None:
        """The failed probe closest above the answer: the reason the search stopped."""
        best = -math.inf if self.best is None else self.best
        above = [p for p in self.probes if not p.passed and p.level > best]
        return min(above, key=lambda p: p.level) if above else None

    def sentence(self) -> str:
        unit = "users" if self.mode == "concurrency" else "requests/s"
        fail = self.next_failure
        if self.best is None:
            lowest = min(self.probes, key=lambda p: p.level)
            return (
                f"No load met the objectives: even {_fmt(lowest.level)} {unit} failed: "
                f"{lowest.reason}."
            )
        head = f"The most this engine takes within the objectives: {_fmt(self.best)} {unit}"
        if fail is None:
            why = f": {self.bound}" if self.bound else ""
            return head + f" (the search's upper bound{why}; nothing above was tried)."
        return head + f"; {_fmt(fail.level)} {unit} failed: {fail.reason}."

    def to_dict(self) -> dict[str, object]:
        fail = self.next_failure
        return {
            "mode": self.mode,
            "best": self.best,
            "sentence": self.sentence(),
            "next_failure": fail.reason if fail else None,
            "probes": [
                {"level": p.level, "passed": p.passed, "reason": p.reason} for p in self.probes
            ],
        }


def slo_failure(point: LoadPoint, slo_ms: Mapping[str, float]) -> str | None:
    """Why `point` misses the objectives, in words and numbers; None when it meets them."""
    if not point.ok:
        return point.error or "the point failed"
    if point.stopped_early:
        return point.stopped_early
    if point.failed:
        return f"{point.failed} of {point.completed + point.failed} requests failed"
    misses = []
    for name, limit in slo_ms.items():
        p99 = point.value(f"p99_{name}_ms") or 0.0
        if p99 > limit:
            misses.append(f"p99 {_NAMES[name]} {_ms(p99)} over {_ms(limit)}")
    if not misses:
        return None
    return "; ".join(misses) + cause(point)


def cause(point: LoadPoint) -> str:
    """What the engine's own view says held the requests back, as a clause (or "")."""
    s = point.steps
    if s is None:
        return ""
    if s.preemptions:
        return f": {s.preemptions} preemption(s), the KV pool ran out of blocks"
    waiting = s.waiting_step_share or 0.0
    if s.source == "steps" and waiting >= 0.05:
        kv = waiting * (s.kv_bound_share or 0.0)
        budget = waiting * (s.budget_bound_share or 0.0)
        if kv >= budget:
            return f": waiting for KV blocks in {kv:.0%} of steps"
        return (
            f": requests waited in {budget:.0%} of steps with KV blocks free (the token "
            f"budget or the batch limit; batch up to {s.max_running})"
        )
    if s.max_waiting:
        return f": up to {s.max_waiting} requests waited in the queue"
    return f": the batch ran at up to {s.max_running} requests"


async def find_max(
    runner: LoadRunner,
    mode: LoadMode,
    start: float,
    slo_ms: Mapping[str, float],
    *,
    max_probes: int = 8,
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxFound:
    whole = mode == "concurrency"
    upper = float(MAX_CONCURRENCY) if whole else MAX_RATE
    bound = ""
    prompts = runner.config.num_prompts
    if whole and prompts is not None and prompts < upper:
        # N users with fewer than N requests never have N in flight: not a level to claim.
        upper = float(prompts)
        bound = f"--num-prompts {prompts:,} keeps at most {prompts:,} requests in flight"
    probes: list[Probe] = []
    passed: float | None = None
    failed: float | None = None
    level = max(1.0, round(start)) if whole else start
    while len(probes) < max_probes:
        point = await runner.measure(_level(mode, level))
        reason = slo_failure(point, slo_ms) or _not_reached(point, level, whole)
        probe = Probe(level, reason is None, reason or _met(point, slo_ms), point)
        probes.append(probe)
        if on_probe:
            on_probe(probe)
        if probe.passed:
            passed = level
        else:
            failed = level
        nxt = _next(passed, failed, whole, upper)
        if nxt is None or any(p.level == nxt for p in probes):
            break
        level = nxt
    return MaxFound(mode, passed, tuple(probes), bound)


def _not_reached(point: LoadPoint, level: float, whole: bool) -> str | None:
    """Why a users level that met the objectives cannot be claimed: its requests never
    were that many in flight at once (None when they were, or for a rate)."""
    peak = point.max_concurrent_requests
    if not whole or peak >= level:
        return None
    return f"only {peak:,} of its {_fmt(level)} users' requests were ever in flight at once"


def _next(passed: float | None, failed: float | None, whole: bool, upper: float) -> float | None:
    if failed is None:
        assert passed is not None
        return min(passed * 2, upper) if passed < upper else None
    if passed is None:
        if whole:
            return None if failed <= 1 else float(max(1, math.floor(failed / 2)))
        return failed / 2
    if whole:
        return None if failed - passed <= 1 else float((passed + failed) // 2)
    return None if failed / passed <= 1.1 else (passed + failed) / 2


def _level(mode: LoadMode, level: float) -> LoadLevel:
    return LoadLevel.users(int(level)) if mode == "concurrency" else LoadLevel.per_second(level)


def _met(point: LoadPoint, slo_ms: Mapping[str, float]) -> str:
    return ", ".join(f"p99 {_NAMES[n]} {_ms(point.value(f'p99_{n}_ms') or 0.0)}" for n in slo_ms)


def _ms(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:,.0f} ms"


def _fmt(level: float) -> str:
    return f"{level:,.0f}" if level == int(level) else f"{level:,.2f}"
