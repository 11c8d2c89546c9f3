"""Traffic in the playground: the Load box, its points, the knee (issue #20, item 5)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tui_helpers import WIDE, engine_ready, make_app, settle, wait_until

from bench.load_result import LoadPoint
from engine.fake import FakeConfig
from tui.live_load import knee
from tui.widgets.count_stepper import CountStepper

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.pilot import Pilot

CONFIG = FakeConfig(max_model_len=2048, total_blocks=256)


def _point(users: int, out_tps: float, itl_ms: float) -> LoadPoint:
    return LoadPoint(
        profile="concurrency",
        max_concurrency=users,
        request_rate=None,
        burstiness=None,
        completed=10,
        output_throughput=out_tps,
        median_itl_ms=itl_ms,
        p99_ttft_ms=100.0 * users,
    )


def test_the_knee_is_the_last_level_before_more_users_stopped_paying() -> None:
    points = [_point(1, 40, 25), _point(2, 78, 26), _point(4, 150, 27), _point(8, 170, 47)]
    k = knee(points)
    assert k is not None and k.max_concurrency == 4
    assert knee(points[:3]) is None  # still linear: no knee yet
    assert knee([dataclasses.replace(points[0], ok=False), *points[1:3]]) is None


async def test_users_turned_up_live_make_points_and_turned_off_stop_the_traffic() -> None:
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        stepper = main.controls.query_one("#load-users", CountStepper)
        load = main.live_load
        stepper.value = 2
        await wait_until(pilot, lambda: len(load.points) >= 1, timeout=30, what="a load point")
        first = load.points[0]
        assert first.ok and first.max_concurrency == 2 and first.completed > 0
        assert first.output_throughput > 0
        stepper.value = 4
        await wait_until(
            pilot,
            lambda: any(p.max_concurrency == 4 for p in load.points),
            timeout=30,
            what="a point at 4 users",
        )
        await settle(pilot, quiet=False)  # the load goes on
        line = str(main.controls.query_one("#load-line").render())
        assert "4 users" in line and "tok/s out" in line
        assert main.query_one("#load-plot-box").display
        # A chat reply sent meanwhile says its numbers were taken under load.
        await main.send("hello")
        assert main.current is not None
        assert "under load (4 users)" in main.current.title
        stepper.value = 0
        await wait_until(pilot, lambda: not main._load_running, what="the load to stop")
        await wait_until(pilot, lambda: not main.busy, what="the chat reply")
        # No load request is left in the engine: the pool empties.
        await settle(pilot)
        latest = main.telemetry.latest
        assert latest is not None and latest.free_blocks == latest.total_blocks
        assert str(main.controls.query_one("#load-line").render()).startswith("off")


def test_snapshot_of_the_load_plot_with_its_knee(snap_compare: Callable[..., bool]) -> None:
    app = make_app(CONFIG)

    async def before(pilot: Pilot[int]) -> None:
        await engine_ready(pilot)
        main = app.main_screen
        for p in (_point(1, 40, 25), _point(2, 78, 26), _point(4, 150, 27), _point(8, 170, 47)):
            main.live_load.measured(p)
        main.live_load.ceiling = lambda b: b / (0.024 + 0.0004 * b)
        await settle(pilot)
        main.engine_panel.query_one("#engine-grid").scroll_end(animate=False)
        await settle(pilot)

    assert snap_compare(app, run_before=before, terminal_size=WIDE)


async def test_ctrl_t_doubles_the_load_and_ctrl_o_stops_it() -> None:
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        stepper = main.controls.query_one("#load-users", CountStepper)
        await pilot.press("ctrl+t")
        assert stepper.value == 1
        await pilot.press("ctrl+t", "ctrl+t")
        assert stepper.value == 4 and main.live_load.users == 4
        await pilot.press("ctrl+o")
        assert stepper.value == 0
        await wait_until(pilot, lambda: not main._load_running, what="the load to stop")
