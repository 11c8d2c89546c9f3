"""The live demo under load, as a presenter runs it (issue #31, items 7, 8 and 14): every
plot on screen at 160x48 with 8 and 64 users, a Load plot whose key says only what it
draws and whose points name their users, and a footer that keeps F1, F5 and Ctrl+T.

All on the FakeEngine on virtual time; the snapshots build their state from samples and
points, so nothing in them depends on how far a loaded machine got.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from test_tui_live_load import _point
from textual.content import Content
from textual.widgets._footer import FooterKey
from tui_helpers import NARROW, WIDE, engine_ready, make_app, settle, step_sample, wait_until

from engine.events import RequestBlocks
from engine.fake import FakeConfig
from tui.load_figure import load_key, load_points_figure
from tui.widgets.count_stepper import CountStepper
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.pilot import Pilot
    from textual.widget import Widget

    from tui.app import KvscopeApp
    from tui.screens.main import MainScreen

POOL = FakeConfig(max_model_len=2048, total_blocks=64)
"""The fake's pool as `kvscope --fake` has it: 8 users of 512 + 128 tokens overfill it."""
PLOT_BOXES = ("#kv-box", "#itl-box", "#ttft-box", "#load-plot-box")
LEVELS = (1, 2, 4, 8, 16, 32, 64)
NAMED = 3
"""Requests the block map names at most; the rest are one "+N more" line (a line each
pushed the plots below the fold)."""


def _inside(outer: Widget, inner: Widget) -> bool:
    return outer.region.contains_region(inner.region)


def _plots_off_screen(main: MainScreen) -> list[str]:
    """The plot boxes shown but not wholly inside the Engine column's visible grid."""
    panel = main.engine_panel
    grid = panel.query_one("#engine-grid")
    return [
        box
        for box in PLOT_BOXES
        if panel.query_one(box).display and not _inside(grid, panel.query_one(box))
    ]


def _legend(main: MainScreen) -> str:
    return main.engine_panel.query_one(KvBlockMap).as_text().plain


# -- item 7: the right column at 8 users, live ------------------------------------------------
async def test_eight_live_load_users_keep_every_plot_and_the_load_box_on_screen() -> None:
    app = make_app(POOL)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await pilot.press("ctrl+t", "ctrl+t", "ctrl+t", "ctrl+t")
        load = main.live_load
        assert load.users == 8
        # The first point (1 user) ends, then 8 users fill the 64-block pool and preempt.
        await wait_until(
            pilot,
            lambda: (
                any(p.max_concurrency == 8 for p in load.points)
                and app.telemetry.preemptions_total > 0
            ),
            timeout=60,
            what="a point at 8 users, with a preemption",
        )
        # The block map names a few requests and counts the rest on one line: read once the
        # map draws more holders than it names (the load goes on, so read that one drawing).
        legends: list[str] = []

        def counted() -> bool:
            legends.append(_legend(main))
            return " more request" in legends[-1]

        await wait_until(
            pilot, counted, timeout=60, what="more requests holding blocks than the legend names"
        )
        assert legends[-1].count("█ load-") <= NAMED, legends[-1]
        await settle(pilot, quiet=False)  # the load goes on
        assert main.engine_panel.preemption_text()
        assert _plots_off_screen(main) == []
        # The Load box in the Controls column is on screen too.
        assert _inside(main.controls, main.controls.query_one("#load-box"))
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: not main._load_running, what="the load to stop")


# -- item 7: snapshots at 8 and 64 users --------------------------------------------------------
def _under_load(users: int) -> Callable[[Pilot[int]], object]:
    """The screen as `users` load users leave it: every one holding blocks of the pool, the
    newest just preempted, a point measured at each level up to `users` (a knee at 8)."""

    async def before(pilot: Pilot[int]) -> None:
        await engine_ready(pilot)
        app: KvscopeApp = pilot.app  # type: ignore[assignment]
        main = app.main_screen
        each = 64 // users  # the whole pool, shared out
        held = tuple(
            RequestBlocks(f"load-7-1-{i}", tuple(range(i * each, (i + 1) * each)), 16 * each)
            for i in range(users)
        )
        app.telemetry.add_sample(
            step_sample(1, blocks=held, free=0, total=64, block_size=16, running=users)
        )
        app.telemetry.add_sample(
            step_sample(
                2,
                started_at=1.2,
                blocks=held[:-1],
                free=each,
                total=64,
                block_size=16,
                running=users - 1,
                decode=users - 1,
                preempted=(held[-1].request_id,),
            )
        )
        stepper = main.controls.query_one("#load-users", CountStepper)
        # Only the state of `users` users: no load worker runs, so nothing moves on.
        with stepper.prevent(CountStepper.Changed):
            stepper.value = users
        main.live_load.users = users
        for level in (u for u in LEVELS if u <= users):
            main.live_load.measured(_point(level, 40.0 * min(level, 6), 25.0 + level))
        main.live_load.ceiling = lambda b: b / (0.024 + 0.0004 * b)
        main._show_load()  # the Load box's line, as the load worker keeps it
        await settle(pilot)
        assert _plots_off_screen(main) == []
        assert f"+{users - 1 - NAMED} more requests" in _legend(main)
        assert _inside(main.controls, main.controls.query_one("#load-box"))

    return before


@pytest.mark.parametrize("users", [8, 64])
def test_snapshot_of_the_demo_under_load(snap_compare: Callable[..., bool], users: int) -> None:
    assert snap_compare(make_app(POOL), terminal_size=WIDE, run_before=_under_load(users))


# -- item 8: the Load plot's key and labels -----------------------------------------------------
def test_the_load_key_names_only_what_the_plot_draws() -> None:
    points = [_point(1, 40, 25), _point(2, 78, 26)]
    far = load_points_figure(points, lambda b: 1000.0 * b, 60, 12)
    assert far is not None
    # The roofline is 12x past the points: not drawn, and said so on the plot itself.
    assert far.label == "roofline off the chart: ≥ 1,000 tok/s"
    # Each point carries its users, on its own cell.
    assert [n.text for n in far.notes] == ["●1", "●2"]
    assert [(n.x, n.y) for n in far.notes] == [(40, 25), (78, 26)]
    key = Content.from_markup(load_key(far, points, lambda b: 1000.0 * b, off_chart=False)).plain
    # No knee yet, no roofline drawn: the key promises neither.
    assert key == "●N measured at N users"
    wide = Content.from_markup(load_key(far, points, lambda b: 1000.0 * b)).plain
    assert wide == "●N measured at N users  · roofline off the chart (≥ 1,000 tok/s)"
    bent = [*points, _point(4, 150, 27), _point(8, 170, 47)]
    near = load_points_figure(bent, lambda b: b / (0.024 + 0.0004 * b), 60, 12)
    assert near is not None and near.label == ""
    key = Content.from_markup(load_key(near, bent, lambda b: b / 0.024)).plain
    assert key == "●N measured at N users  · roofline  │ knee"


async def test_the_load_box_labels_its_points_and_keys_only_what_is_drawn() -> None:
    app = make_app(POOL)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        for p in (_point(1, 40, 25), _point(2, 78, 26)):
            main.live_load.measured(p)
        main.live_load.ceiling = lambda b: 1000.0 * b  # as on a busy CPU: far off the chart
        await settle(pilot)
        box = main.engine_panel.query_one("#load-plot-box")
        key = Content.from_markup(str(box.border_subtitle)).plain
        assert key == "●N measured at N users"
        drawn = main.engine_panel.query_one("#load-plot", Plot).render().plain
        assert "roofline off the chart: ≥ 1,000 tok/s" in drawn
        assert "●1" in drawn and "●2" in drawn


# -- item 14: the footer --------------------------------------------------------------------------
def _footer_keys(app: KvscopeApp) -> dict[str, FooterKey]:
    return {key.action: key for key in app.screen.query(FooterKey)}


@pytest.mark.parametrize(
    "size", [pytest.param(NARROW, id="80x24"), pytest.param(WIDE, id="160x48")]
)
async def test_the_footer_always_shows_help_sweep_and_the_load_key(size: tuple[int, int]) -> None:
    app = make_app(POOL)
    async with app.run_test(size=size) as pilot:
        await engine_ready(pilot)
        keys = _footer_keys(app)
        width = size[0]
        for action in ("help", "sweep"):
            assert action in keys and keys[action].region.right <= width, action
        if size == WIDE:
            load = keys["load_users(2)"]
            assert load.region.right <= width and "Load ×2" in load.render().plain
