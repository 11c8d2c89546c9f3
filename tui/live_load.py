"""Traffic in the playground: N users, each sending its next synthetic request when its
last one ends, measured as load points of a few seconds each (bench.load_loops' closed
loop, the same figures as `kvscope bench --concurrency`).

A presenter turns the users up and watches the batch grow, output tokens/s climb, ITL
stay nearly flat, and then bend: each point lands on the load plot, the roofline's
batched-decode curve behind them, and the knee is marked where adding users stopped
paying.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.load_result import LoadConfig, LoadPoint
from engine.errors import KvscopeError
from tui import format as fmt

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import ModelCard

POINT_S = 10.0
"""One load point's length, on the engine's clock: long enough for a few replies of
128 tokens per user on a slow CPU, short enough to watch the plot move."""
LOAD_ID_PREFIX = "load-"


def live_config(users: int, prompt_len: int, output_len: int, seed: int) -> LoadConfig:
    """One point of `users` users for POINT_S seconds; fresh prompts every point."""
    return LoadConfig(
        mode="concurrency",
        levels=(float(users),),
        prompt_len=prompt_len,
        output_len=output_len,
        duration_s=POINT_S,
        warmup=0,
        seed=seed,
    )


def load_ceiling(card: ModelCard, context: int) -> Callable[[int], float] | None:
    """This machine's batched-decode roofline for a CPU engine's model; None elsewhere (a
    GPU's profile must be named: `kvscope bench --hardware`; a fake has no model)."""
    if card.device != "cpu":
        return None
    try:
        from roofline.batched import throughput_ceiling
        from roofline.hardware import load_geometry, load_profile

        return throughput_ceiling(load_geometry(card.path), load_profile("cpu"), context)
    except KvscopeError:
        return None


def knee(points: list[LoadPoint]) -> LoadPoint | None:
    """The last level before adding users stopped paying: the first step up in users
    whose output tokens/s grew by less than half of what a linear gain would give
    (doubling users from 4 to 8 and getting under 1.5x the throughput). None until the
    points show one."""
    by_users = sorted(
        (p for p in points if p.ok and p.max_concurrency and p.output_throughput > 0),
        key=lambda p: p.max_concurrency or 0,
    )
    for low, high in itertools.pairwise(by_users):
        users_gain = (high.max_concurrency or 1) / (low.max_concurrency or 1)
        if users_gain <= 1:
            continue
        wanted = 1 + 0.5 * (users_gain - 1)
        if high.output_throughput / low.output_throughput < wanted:
            return low
    return None


@dataclass
class LiveLoad:
    """The playground's load: how many users, what it has measured, where it stands."""

    users: int = 0
    points: deque[LoadPoint] = field(default_factory=lambda: deque(maxlen=32))
    running_since: float | None = None  # the current point's start, on the engine's clock
    running_users: int = 0
    version: int = 0
    ceiling: Callable[[int], float] | None = None
    """The roofline's output tokens/s at a decode batch, for the curve behind the points."""

    def started_point(self, users: int, at: float) -> None:
        self.running_users, self.running_since = users, at
        self.version += 1

    def measured(self, point: LoadPoint) -> None:
        self.points.append(point)
        self.running_since = None
        self.version += 1

    def stopped(self) -> None:
        self.running_since = None
        self.running_users = 0
        self.version += 1

    def words(self, now: float | None = None) -> str:
        """The Load box's status: what runs, and what the latest point measured."""
        if self.users == 0 and self.running_since is None:
            state = "off"
        elif self.running_since is not None and now is not None:
            users = fmt.count(self.running_users, "user")
            elapsed = max(0.0, now - self.running_since)
            if elapsed <= POINT_S:
                state = f"{users}: point running, {elapsed:.0f} of {POINT_S:.0f} s"
            else:
                # Its POINT_S are up; the replies still in flight end it (not "15 of 10 s").
                state = f"{users}: finishing the point ({POINT_S:.0f} s measured)"
        else:
            state = f"{fmt.count(self.users, 'user')}: starting"
        last = self.points[-1] if self.points else None
        if last is None:
            return state
        if not last.ok:
            return f"{state} · last point failed: {last.error}"
        return f"{state} · last: {point_words(last)}"


def point_words(p: LoadPoint) -> str:
    batch = f", batch {p.steps.mean_running:.1f}" if p.steps is not None else ""
    roof = (
        f" (roofline {p.roofline_output_throughput:,.0f})"
        if p.roofline_output_throughput is not None and math.isfinite(p.roofline_output_throughput)
        else ""
    )
    return (
        f"{fmt.count(p.max_concurrency or 0, 'user')} {p.output_throughput:,.1f} tok/s out{roof}, "
        f"ITL p50 {p.median_itl_ms:,.0f} ms, TTFT p99 {p.p99_ttft_ms:,.0f} ms{batch}"
    )
