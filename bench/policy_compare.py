"""Two (or more) router policies on one fleet, measured with the same multi-turn workload.

Each policy is a router URL in front of the same replicas; the runs go one after the
other, each with its own sessions (a run's prefixes are its own, so a later policy never
finds an earlier one's turns cached). What the comparison says is computed from the
numbers, whichever way they came out: the host is noisy, so nothing here assumes that
cache-aware routing wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.multi_turn import MultiTurnConfig, MultiTurnResult, TurnSummary

# Hit rates closer than this are "alike": a block or two of the system prompt apart.
HIT_RATE_ALIKE = 0.02
# TTFTs whose ratio is within this of 1 are "about the same" on this noisy host.
TTFT_ALIKE = 0.05


@dataclass
class PolicyComparison:
    """The runs, by policy name in the order given, and the policies that could not run."""

    config: MultiTurnConfig
    urls: dict[str, str]  # name -> router URL (no credentials)
    results: dict[str, MultiTurnResult] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # name -> what stopped it

    def to_dict(self) -> dict[str, Any]:
        policies: dict[str, Any] = {}
        for name, url in self.urls.items():
            result = self.results.get(name)
            entry: dict[str, Any] = result.to_dict() if result is not None else {}
            entry["url"] = url  # the router's, whatever the run said
            if name in self.failed:
                entry["error"] = self.failed[name]
            policies[name] = entry
        return {
            "kind": "multi_turn_compare",
            "config": self.config.to_dict(),
            "seed": self.config.seed,
            "policies": policies,
            "verdict": verdict(self),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        from bench.multi_turn import records_csv

        return records_csv([(n, r) for n, res in self.results.items() for r in res.records])


def _later_or_all(result: MultiTurnResult) -> TurnSummary:
    return result.later() or result.overall()


def verdict(comparison: PolicyComparison) -> str:
    """What the numbers show, in a sentence or two: the second policy against the first."""
    measured = [(n, r) for n, r in comparison.results.items() if r.completed]
    if len(measured) < 2:
        return "Fewer than two policies were measured: nothing to compare."
    (a, ra), (b, rb) = measured[0], measured[1]
    la, lb = _later_or_all(ra), _later_or_all(rb)
    which = "all turns" if ra.later() is None else f"turns {la.turns}"
    parts = []
    ha, hb = la.hit_rate, lb.hit_rate
    if ha is not None and hb is not None:
        parts.append(f"prefix hit rate ({which}) {hb:.0%} against {ha:.0%}")
    ttft: float | None = None
    ma, mb = la.mean_ttft_ms, lb.mean_ttft_ms  # None: no turn of those finished
    if ma is not None and mb is not None and ma > 0:
        ttft = mb / ma
        word = "lower" if ttft < 1 else "higher"
        parts.append(
            f"mean TTFT ({which}) {mb:,.0f} ms against {ma:,.0f} ms (x{ttft:.2f}, {b} {word})"
        )
    if ra.output_throughput > 0:
        parts.append(f"output throughput x{rb.output_throughput / ra.output_throughput:.2f}")
    head = f"{b} against {a}: " + "; ".join(parts) + "."
    said = f"{head} {_reading(a, b, ha, hb, ttft, single_turn=ra.later() is None)}"
    control = _uncached_turns(ra, rb)
    if control is not None and ttft is not None:
        span, ratio = control
        if abs(ratio - 1) > TTFT_ALIKE:
            faster = b if ratio < 1 else a
            said += (
                f" Turns where neither found anything cached ({span}) were x{ratio:.2f} under "
                f"{b} too ({faster} faster): part of the gap is the load balance or the host, "
                "not the cache."
            )
    return said


def _uncached_turns(ra: MultiTurnResult, rb: MultiTurnResult) -> tuple[str, float] | None:
    """The turns where neither run found a prefix cached (a control: routing changed no
    prefill there), and b's mean TTFT over them against a's; None without such turns or
    without cache figures."""
    from bench.multi_turn import TurnSummary

    turns = []
    for sa, sb in zip(ra.by_turn(), rb.by_turn(), strict=False):
        if sa.hit_rate is None or sb.hit_rate is None:
            return None
        if sa.hit_rate < HIT_RATE_ALIKE and sb.hit_rate < HIT_RATE_ALIKE:
            turns.append(int(sa.turns))
    if not turns:
        return None
    pa = TurnSummary.of("", [r for r in ra.records if r.turn in turns])
    pb = TurnSummary.of("", [r for r in rb.records if r.turn in turns])
    ma, mb = pa.mean_ttft_ms, pb.mean_ttft_ms
    if ma is None or mb is None or ma <= 0:
        return None
    span = f"turn {turns[0]}" if len(turns) == 1 else "turns " + ", ".join(map(str, turns))
    return span, mb / ma


def _reading(
    a: str,
    b: str,
    ha: float | None,
    hb: float | None,
    ttft: float | None,
    *,
    single_turn: bool,
) -> str:
    """The one-line reading of the figures above; never a fixed text."""
    if single_turn:
        return "With one turn per session no prefix is reused: the policies differ only in balance."
    if ha is None or hb is None:
        return (
            "The server did not say how many prompt tokens were cached (start vLLM with "
            "--enable-prompt-tokens-details --enable-per-request-metrics): TTFT alone is compared."
        )
    if abs(hb - ha) < HIT_RATE_ALIKE:
        return (
            "Both policies found about as much of each prompt cached: routing made no "
            "difference to the hits here."
        )
    better = b if hb > ha else a
    if ttft is None or abs(ttft - 1) <= TTFT_ALIKE:
        return (
            f"{better} found more of each conversation cached, but its later turns were not "
            "faster: prefill was not what their TTFT waited on here (queueing or a busy host)."
        )
    faster = b if ttft < 1 else a
    if faster == better:
        return (
            f"{better} sent more of each session's turns to the replica that held its prefix, "
            "so those turns prefilled less and their first token came sooner."
        )
    return (
        f"{better} found more of each conversation cached, yet {faster}'s later turns were "
        "faster: the load balance (or the host) outweighed the saved prefill in this run."
    )
