"""The sweep screen's load mode (issue #20, item 5): F4 switches it on; F6 runs
`bench.load_runner.run_load` over the users on the FakeEngine (virtual time), with the
level-by-level progress, the throughput-vs-latency plot, export and F9 overlay."""

from __future__ import annotations

import csv
import io
import json
import math
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_load_runner import SimClock
from textual.content import Content
from textual.widgets import DataTable, Input, ProgressBar, Static
from tui_helpers import NARROW, WIDE, HoldingClock, engine_ready, make_app, settle, wait_until

import tui.sweep.load_pane as sweep_module
from bench.load_result import LoadPoint
from bench.load_runner import LoadTick
from bench.sweep_files import SavedLoad, load_saved
from engine.fake import FakeConfig, FakeEngine
from tui.load_figure import POINT_MARK, load_points_figure
from tui.sweep.load_view_model import (
    LoadForm,
    LoadProgress,
    done_words,
    parse_levels,
    point_notes,
    read_load_form,
    result_cell,
)
from tui.sweep.overlay import OVERLAY_ROLE
from tui.sweep.screen import SweepScreen
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.pilot import Pilot

CONFIG = FakeConfig(max_model_len=2048, total_blocks=256)
SAVED_LOAD = Path(__file__).parent / "fixtures" / "sweep" / "load-saved.json"
"""A saved load run: 1, 2, 4, 8 users at 40, 76, 120, 130 tok/s, ITL 24, 25, 31, 33 ms."""
SMALL_POOL = FakeConfig(max_model_len=2048, total_blocks=24)
"""Four users of 64 + 32 tokens fill the pool: eight wait, and throughput stops growing."""


def _ceiling(b: int) -> float:
    """A made-up batched-decode roofline near the fake's 20 ms step."""
    return b / (0.018 + 0.0004 * b)


def _text(screen: SweepScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def _load_mode(pilot: Pilot[int], **fields: str) -> SweepScreen:
    """F5, then F4: the sweep screen in its load mode, with `fields` typed in."""
    await engine_ready(pilot)
    await pilot.press("f5")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, SweepScreen)
    await pilot.press("f4")
    await pilot.pause()
    assert screen.mode == "load"
    for field_id, value in fields.items():
        screen.query_one(f"#{field_id.replace('_', '-')}", Input).value = value
    return screen


async def _run_to_end(pilot: Pilot[int], screen: SweepScreen) -> None:
    await pilot.press("f6")
    await wait_until(
        pilot, lambda: screen.load_result is not None and not screen.running, 60, "the load"
    )
    await settle(pilot)


def _engine_idle(engine: object) -> bool:
    """No request left in the fake: none live in its book, no stream open, all blocks free."""
    assert isinstance(engine, FakeEngine)
    book = engine._book
    return (
        not len(book)
        and not book.open_streams()
        and len(engine._free) == engine.config.total_blocks
    )


async def test_a_load_sweep_runs_the_users_and_its_export_reads_back(tmp_path: Path) -> None:
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        screen = await _load_mode(
            pilot, load_levels="1 2 4", load_requests="4", export_path=str(tmp_path / "load")
        )
        assert screen.sub_title == "load sweep"
        assert "F4" in str(screen.query_one("#mode").render())
        await _run_to_end(pilot, screen)
        result = screen.load_result
        assert result is not None and result.complete
        points = result.points
        assert [p.label for p in points] == ["1 user", "2 users", "4 users"]
        assert [p.completed for p in points] == [4, 4, 4]
        # The users batch in the engine's own steps, and throughput grows with them.
        assert [p.steps.max_running if p.steps else 0 for p in points] == [1, 2, 4]
        assert points[2].output_throughput > 3 * points[0].output_throughput
        assert _text(screen, "#sweep-status") == "Done: 3 load levels measured. F7/F8 export."
        assert screen.query_one("#load-sweep-table", DataTable).row_count == 3
        await wait_until(pilot, lambda: screen.query_one("#load-sweep-plot", Plot).has_drawing)
        assert not screen.query_one("#sweep-ttft-box").display  # the other mode's charts
        assert screen.query_one(ProgressBar).progress == 1000

        await pilot.press("f7", "f8")
        await pilot.pause()
        json_path, csv_path = tmp_path / "load.json", tmp_path / "load.csv"
        for path in (json_path, csv_path):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600  # private, as the sweep's
        assert _text(screen, "#sweep-status").startswith("Wrote 3 points to ")
        saved = load_saved(json_path)
        assert isinstance(saved, SavedLoad)
        assert saved.result.config == result.config
        assert saved.result.model == json.loads(json.dumps(result.model))
        for live, back in zip(points, saved.result.points, strict=True):
            assert back.label == live.label
            assert back.row() == live.row()  # every figure, the step view's too
            assert back.requests == live.requests
        rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
        assert [r["label"] for r in rows] == ["1 user", "2 users", "4 users"]
        assert float(rows[2]["output_throughput"]) == points[2].output_throughput

        # F9 draws the saved run under the live one, and compares level by level.
        screen.query_one("#load-path", Input).value = str(json_path)
        await pilot.press("f9")
        await wait_until(pilot, lambda: screen.load_overlay is not None)
        await pilot.pause()
        assert (
            _text(screen, "#sweep-status")
            == "Loaded load.json: a load sweep, 3 levels, drawn as ◆."
        )
        legend = _text(screen, "#load-sweep-overlay")
        assert "Overlaid: load.json, a saved load sweep" in legend
        assert "1, 2, 4 users · 64-token prompts · 32 output tokens · 4 requests a level" in legend
        assert "live / ◆  1 user: tok/s 1.00x, ITL 1.00x · 2 users: tok/s 1.00x" in legend
        overlay = screen.load_overlay
        assert overlay is not None
        figure = load_points_figure(points, None, 80, 12, overlay.series())
        assert figure is not None
        (drawn,) = [s for s in figure.series if s.role == OVERLAY_ROLE]
        assert drawn.marker == "◆"
        assert drawn.xs == tuple(p.output_throughput for p in points)
        assert any(s.marker == POINT_MARK for s in figure.series)


async def test_progress_says_the_level_and_time_left_and_f6_stops_cleanly(
    tmp_path: Path,
) -> None:
    # Warm-up (5 steps), the 1-user level (4 x 33 steps), then hold inside the 2-user level.
    clock = HoldingClock(hold_after=160)
    app = make_app(CONFIG, clock=clock)
    try:
        async with app.run_test(size=WIDE) as pilot:
            screen = await _load_mode(
                pilot, load_levels="1 2 4", load_requests="4", export_path=str(tmp_path / "p")
            )
            await pilot.press("f6")
            await wait_until(pilot, lambda: clock.holding, 30, "the hold")
            await settle(pilot)
            line = _text(screen, "#sweep-run")
            # Time left is fitted to the level done: 2 rounds at 2 users, 1 at 4 users.
            assert line.startswith("level 2 of 3 · 2 users · "), line
            assert " in flight · about " in line and line.endswith(" left"), line
            bar = screen.query_one(ProgressBar).progress
            assert 333 <= bar < 667, bar
            await pilot.press("f4")  # no switching mid-run
            assert screen.mode == "load"
            assert "stop it first (F6)" in _text(screen, "#sweep-status")

            await pilot.press("f6")
            await pilot.pause()
            assert not screen.running
            status = _text(screen, "#sweep-status")
            assert status == (
                "Stopped: the requests in flight were aborted; 1 load level measured, "
                "kept for F7/F8 export."
            )
            clock.release()
            # Nothing of the load is left in the engine: every stream was aborted.
            await wait_until(pilot, lambda: _engine_idle(app.engine), 10, "the engine to drain")
            result = screen.load_result
            assert result is not None and not result.complete
            assert [p.label for p in result.points] == ["1 user"]
            await pilot.press("f7")
            await pilot.pause()
            data = json.loads((tmp_path / "p.json").read_text())
            assert data["kind"] == "load" and data["complete"] is False
            assert len(data["points"]) == 1
    finally:
        clock.release()


async def test_escape_mid_load_stops_it_and_the_chat_still_answers() -> None:
    clock = HoldingClock(hold_after=60)
    app = make_app(CONFIG, clock=clock)
    try:
        async with app.run_test(size=WIDE) as pilot:
            screen = await _load_mode(pilot, load_levels="2 4")
            await pilot.press("f6")
            await wait_until(pilot, lambda: clock.holding, 30, "the hold")
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, SweepScreen)
            assert not screen.running
            clock.release()
            await wait_until(pilot, lambda: _engine_idle(app.engine), 10, "the engine to drain")
            # Stopped, not finished out of sight: no level was measured after the Esc.
            await pilot.pause(0.2)
            result = screen.load_result
            assert result is not None and not result.complete
            assert result.points == []
            main = app.main_screen
            assert await main.send("hello")
            await wait_until(pilot, lambda: not main.busy, 10, "the chat reply")
            assert main.current is not None
            (copy,) = main.current.copies
            assert copy.finished is not None and copy.finished.reason != "abort"
    finally:
        clock.release()


async def test_an_over_saturated_rate_level_stops_early_and_says_so() -> None:
    # About 50 tokens/s of decode under a 64-token budget: 40 requests/s cannot be kept up.
    clock = SimClock()
    app = make_app(
        FakeConfig(max_model_len=2048, total_blocks=256, max_num_batched_tokens=64), clock=clock
    )
    async with app.run_test(size=WIDE) as pilot:
        screen = await _load_mode(
            pilot, load_levels="40 req/s", load_requests="400", load_output_len="16"
        )
        await _run_to_end(pilot, screen)
        result = screen.load_result
        assert result is not None
        (point,) = result.points
        assert point.stopped_early is not None and point.stopped_early.startswith("over-saturated")
        notes = _text(screen, "#load-sweep-notes")
        assert notes.startswith("⚠ 40 req/s: stopped early after ")
        assert "over-saturated" in notes
        status = _text(screen, "#sweep-status")
        assert "(1 stopped early: over-saturated, see the notes)" in status
        table = screen.query_one("#load-sweep-table", DataTable)
        assert str(table.get_row_at(0)[-1]) == "stopped early"


async def test_bad_load_fields_say_why_in_one_line() -> None:
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        screen = await _load_mode(pilot)
        for field_id, value, words in (
            ("load-levels", "1 two 4", "load levels: 'two' is not a number"),
            ("load-levels", "0 2", "load levels: 0 is not a positive whole number"),
            ("load-levels", "1.5 users", "load levels: '1.5' users is not a whole number"),
            ("load-levels", "users", "load levels: give numbers of users"),
            ("load-requests", "0", "requests/level: 0 is not between 1 and 1,000,000"),
            ("load-prompt-len", "2040", "prompt and output tokens: 2,040 + 32 is past the context"),
        ):
            before = screen.query_one(f"#{field_id}", Input).value
            screen.query_one(f"#{field_id}", Input).value = value
            await pilot.press("f6")
            await pilot.pause()
            status = _text(screen, "#sweep-status")
            assert status.startswith(words), (value, status)
            assert screen.query_one("#sweep-status").has_class("-error")
            assert not screen.running
            screen.query_one(f"#{field_id}", Input).value = before
        await pilot.press("f7")
        await pilot.pause()
        assert _text(screen, "#sweep-status") == "Nothing to export yet: run a load sweep first."


async def test_the_modes_keep_their_own_fields_and_paths() -> None:
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await pilot.press("f5")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        export = screen.query_one("#export-path", Input)
        assert export.value.endswith("kvscope-sweep")
        assert screen.query_one("#lens", Input).display and screen.mode == "length"
        await pilot.press("f4")
        await pilot.pause()
        assert export.value.endswith("kvscope-load")
        assert screen.query_one("#load-path", Input).value.endswith("kvscope-load.json")
        assert not screen.query_one("#lens").parent.display  # type: ignore[union-attr]
        assert screen.query_one("#load-sweep-results").display
        await pilot.press("f4")
        await pilot.pause()
        assert screen.mode == "length" and export.value.endswith("kvscope-sweep")
        assert not screen.query_one("#load-sweep-results").display


# -- snapshots: a finished load sweep, the knee and the roofline's curve ---------------------


def _snapshot_app(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> tuple[object, Callable[[Pilot[int]], object]]:
    # The fake has no roofline: this one stands in for the CPU's, the curve behind the points.
    monkeypatch.setattr(sweep_module, "load_ceiling", lambda card, context: _ceiling)
    monkeypatch.chdir(SAVED_LOAD.parent)  # the path field shows the same words anywhere
    app = make_app(SMALL_POOL)

    async def before(pilot: Pilot[int]) -> None:
        screen = await _load_mode(pilot, load_levels="1 2 4 8", export_path="kvscope-load")
        await _run_to_end(pilot, screen)
        await wait_until(pilot, lambda: screen.query_one("#load-sweep-plot", Plot).has_drawing)
        if size == WIDE:
            # A saved run (F9) under the live one, compared level by level.
            screen.query_one("#load-path", Input).value = SAVED_LOAD.name
            await pilot.press("f9")
            await wait_until(pilot, lambda: screen.load_overlay is not None)
        if size == NARROW:
            body = screen.query_one("#sweep-body")
            body.scroll_to_widget(screen.query_one("#load-sweep-box"), animate=False, top=True)
        await settle(pilot)  # the app's own quiet, not a guess at a loaded host's speed

    return app, before


def test_snapshot_of_a_finished_load_sweep_wide(
    snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, before = _snapshot_app(monkeypatch, WIDE)
    assert snap_compare(app, run_before=before, terminal_size=WIDE)


def test_snapshot_of_a_finished_load_sweep_narrow(
    snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, before = _snapshot_app(monkeypatch, NARROW)
    assert snap_compare(app, run_before=before, terminal_size=NARROW)


# -- the view model, without a screen ------------------------------------------------------


def test_levels_read_as_users_or_rates() -> None:
    assert parse_levels("1 2 4 8") == ("concurrency", (1.0, 2.0, 4.0, 8.0))
    assert parse_levels("1, 2 users") == ("concurrency", (1.0, 2.0))
    assert parse_levels("0.5 1 inf req/s") == ("rate", (0.5, 1.0, math.inf))
    config = read_load_form(LoadForm(levels="2 4"), None, seed=3)
    assert (config.mode, config.levels, config.num_prompts) == ("concurrency", (2.0, 4.0), 8)
    assert (config.prompt_len, config.output_len, config.warmup, config.seed) == (64, 32, 1, 3)


def _tick(point: int, done: int, sent: int, label: str = "2 users") -> LoadTick:
    return LoadTick(point, 3, label, sent, done, 8, 0.0, None)


def test_progress_words_and_time_left_from_the_levels_done() -> None:
    config = read_load_form(LoadForm(levels="1 2 4"), None, seed=0)
    progress = LoadProgress(config)
    assert progress.line() == "warm-up"
    progress.tick = _tick(1, 3, 4, "1 user")
    # Before a level is done there is nothing to fit: no time left is claimed.
    assert progress.line() == "level 1 of 3 · 1 user · 3 of 8 done, 1 in flight"
    assert progress.fraction() == pytest.approx(3 / 8 / 3)
    # 1 user: 8 rounds of replies in 8 s, 1 s a round. One level known: 1 s a round.
    one = LoadPoint("concurrency", 1, None, None, completed=8, duration_s=8.0)
    progress.level_done(one)
    progress.tick = _tick(2, 4, 6)
    # Left: half of 2 users' 4 rounds, and 4 users' 2 rounds: 4 s.
    assert progress.seconds_left() == pytest.approx(4.0)
    assert progress.line() == "level 2 of 3 · 2 users · 4 of 8 done, 2 in flight · about 4 s left"
    # Two levels known: a round costs 1 s at 1 user and 1.5 s at 2, so 2.5 s at 4 users.
    two = LoadPoint("concurrency", 2, None, None, completed=8, duration_s=6.0)
    progress.level_done(two)
    progress.tick = _tick(3, 0, 4, "4 users")
    assert progress.seconds_left() == pytest.approx(2 * 2.5)


def test_notes_put_an_early_stop_first_in_words() -> None:
    stopped = LoadPoint(
        "rate",
        None,
        4.0,
        1.0,
        completed=6,
        aborted=9,
        stopped_early="over-saturated: the queue grew",
        notes=("stopped early after 15 requests: over-saturated: the queue grew",),
    )
    calm = LoadPoint("rate", None, 1.0, 1.0, completed=8, notes=("2 of 8 requests waited",))
    assert point_notes([calm, stopped]) == [
        "1 req/s: 2 of 8 requests waited",
        "⚠ 4 req/s: stopped early after 15 requests: over-saturated: the queue grew",
    ]
    assert result_cell(stopped) == "stopped early"
    assert result_cell(calm) == "ok"
    assert done_words([calm, stopped]) == (
        "Done: 2 load levels measured (1 stopped early: over-saturated, see the notes). "
        "F7/F8 export."
    )


async def test_a_roofline_far_past_the_points_is_named_in_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As on a busy CPU: the ceiling is 20x what was measured, and its curve is left out.
    monkeypatch.setattr(sweep_module, "load_ceiling", lambda card, context: lambda b: 1000.0 * b)
    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        screen = await _load_mode(pilot, load_levels="1 2", load_requests="2")
        await _run_to_end(pilot, screen)
        await wait_until(pilot, lambda: screen.query_one("#load-sweep-plot", Plot).has_drawing)
        key = Content.from_markup(str(screen.query_one("#load-sweep-box").border_subtitle)).plain
        assert "· roofline off the chart (≥ 1,000 tok/s)" in key
        table = screen.query_one("#load-sweep-table", DataTable)
        assert str(table.get_row_at(0)[3]) == "1,000"
