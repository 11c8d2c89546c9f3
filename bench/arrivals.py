"""When an open-loop load sends each request: seeded Poisson, constant or gamma arrivals.

The gaps follow `vllm bench serve`'s `get_request`: a gamma distribution of shape
`burstiness` and scale 1 / (rate x burstiness), so the mean gap is 1 / rate whatever the
shape; burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular; a
constant pattern is the limit of infinite burstiness. A rate of `inf` sends everything at
once. The schedule is drawn in full before the first send, from its own seeded generator,
so the sender only sleeps and the same seed gives the same schedule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from engine.errors import BadOption

ArrivalKind = Literal["poisson", "constant", "gamma"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = ("poisson", "constant", "gamma")

MAX_SCHEDULED = 1_000_000
"""The most sends one point may plan: a schedule is a list held in memory."""


@dataclass(frozen=True, slots=True)
class ArrivalPattern:
    """Requests per second and how their gaps spread."""

    rate: float  # requests/s; math.inf sends all at once
    kind: ArrivalKind = "poisson"
    burstiness: float = 1.0  # the gamma shape; 1 for Poisson
    seed: int = 0

    def validate(self) -> None:
        if math.isnan(self.rate) or self.rate <= 0:
            raise BadOption("--request-rate", f"{self.rate:g} is not a positive rate")
        if self.kind not in ARRIVAL_KINDS:
            raise BadOption("--arrival", f"{self.kind!r} is not one of {', '.join(ARRIVAL_KINDS)}")
        if math.isinf(self.burstiness) and self.burstiness > 0:
            # Infinitely regular gaps: what --arrival constant already is.
            raise BadOption(
                "--burstiness", "inf is no gamma shape: for even gaps use --arrival constant"
            )
        if not self.burstiness > 0:
            raise BadOption("--burstiness", f"{self.burstiness:g} is not a positive number")

    @property
    def shape(self) -> float:
        """The gamma shape of the gaps (inf: every gap the same)."""
        if self.kind == "constant":
            return math.inf
        return 1.0 if self.kind == "poisson" else self.burstiness


def gaps(pattern: ArrivalPattern, count: int) -> list[float]:
    """`count` seeded gaps between sends, in seconds (the first is the wait before the
    first send, as in vLLM)."""
    pattern.validate()
    if math.isinf(pattern.rate):
        return [0.0] * count
    if math.isinf(pattern.shape):
        return [1.0 / pattern.rate] * count
    rng = random.Random(pattern.seed)
    scale = 1.0 / (pattern.rate * pattern.shape)
    return [rng.gammavariate(pattern.shape, scale) for _ in range(count)]


def schedule_count(pattern: ArrivalPattern, count: int, *, rescale: bool = True) -> list[float]:
    """The planned send times (from the point's start) of `count` requests.

    With `rescale`, the times are stretched so that the last falls at count / rate, as
    vLLM does for a fixed number of prompts ("to stabilize throughput across seeds");
    the spread of the gaps, which the pattern is about, is kept.
    """
    _check_count(count)
    times = list(_cumulative(gaps(pattern, count)))
    if rescale and times and times[-1] > 0 and math.isfinite(pattern.rate):
        factor = (count / pattern.rate) / times[-1]
        times = [t * factor for t in times]
    return times


def schedule_duration(pattern: ArrivalPattern, duration_s: float) -> list[float]:
    """The planned send times that fall within `duration_s` seconds."""
    pattern.validate()
    if math.isinf(pattern.rate):
        raise BadOption("--duration", "a rate of inf sends everything at once: give --num-prompts")
    expected = pattern.rate * duration_s
    # Enough gaps for the mean plus ten deviations of the count, then cut at the end.
    spread = math.sqrt(expected / min(pattern.shape, 1.0)) if expected > 0 else 0.0
    count = int(expected + 10 * spread + 16)
    _check_count(count)
    return [t for t in _cumulative(gaps(pattern, count)) if t <= duration_s]


def _cumulative(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def _check_count(count: int) -> None:
    if count > MAX_SCHEDULED:
        raise BadOption(
            "--request-rate",
            f"that point would send {count:,} requests; at most {MAX_SCHEDULED:,} per point",
        )
    if count < 1:
        raise BadOption("--num-prompts", f"{count} is not a positive count")
