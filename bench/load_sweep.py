"""`--sweep`: GuideLLM's sweep on any Engine, from synchronous to saturated and between.

First one user at a time (synchronous: the engine's best latency), then everything at once
(throughput: its highest request rate), then `between` open-loop rates spaced evenly
between those two rates. A rate past what the engine sustains stops early as
over-saturated, as any open-loop point does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bench.load_runner import LoadLevel

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.load_result import LoadPoint
    from bench.load_runner import LoadRunner


def between_rates(low: float, high: float, count: int) -> list[float]:
    """`count` rates evenly spaced strictly between `low` and `high` requests/s."""
    if count <= 0 or not (math.isfinite(low) and math.isfinite(high)):
        return []
    high = max(high, low * 1.5)  # a sweep whose ends touch still spreads its rates
    return [low + (high - low) * k / (count + 1) for k in range(1, count + 1)]


async def run_load_sweep(
    runner: LoadRunner,
    *,
    between: int = 4,
    on_point: Callable[[LoadPoint], None] | None = None,
) -> list[LoadPoint]:
    points: list[LoadPoint] = []

    async def measure(level: LoadLevel, total: int) -> LoadPoint:
        point = await runner.measure(level, points=total)
        points.append(point)
        if on_point:
            on_point(point)
        return point

    total = 2 + between
    sync = await measure(LoadLevel.users(1, "synchronous"), total)
    top = await measure(LoadLevel.per_second(math.inf, "throughput"), total)
    if not (sync.ok and top.ok):
        return points
    for rate in between_rates(sync.request_throughput, top.request_throughput, between):
        await measure(LoadLevel.per_second(rate), total)
    return points
