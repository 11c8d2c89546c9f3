"""The sweep screen: runs bench.sweep.run_sweep on the fake, plots and exports points."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from textual.widgets import DataTable, Input
from tui_helpers import engine_ready, make_app, tui_config_dir, wait_until

from bench.sweep import SweepConfig, SweepMetrics, SweepPoint, SweepResult
from engine.events import ModelCard
from tui.screens.sweep import (
    SweepScreen,
    default_prompt_lens,
    eta_seconds,
    parse_lens,
    run_label,
    sweep_figures,
)
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["tui_config_dir"]


async def test_sweep_runs_plots_and_exports(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        await pilot.press("f5")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        # The defaults fit the fake's walls (64-block pool, 2,048 context).
        assert parse_lens(screen.query_one("#lens", Input).value) == (64, 128, 256, 512)
        for field_id, value in (
            ("lens", "64 256 4096"),  # 4,096 is past max_model_len: a failed point
            ("output-len", "16"),
            ("runs", "2"),
            ("warmup", "1"),
            ("concurrency", "2"),
            ("export-path", str(tmp_path / "sweep")),
        ):
            screen.query_one(f"#{field_id}", Input).value = value
        await pilot.press("f6")
        await wait_until(pilot, lambda: len(screen.points) == 3 and not screen.running, 30)
        await pilot.pause(0.3)
        ok = [p for p in screen.points if p.ok]
        assert [p.prompt_len for p in ok] == [64, 256]
        assert (ok[1].value("mean_ttft_ms") or 0) > (ok[0].value("mean_ttft_ms") or 0)
        failed = [p for p in screen.points if not p.ok]
        assert failed
        assert "Prompt too long" in (failed[0].error or "")
        assert screen.query_one(DataTable).row_count == 3
        assert screen.query_one("#sweep-ttft", Plot).has_drawing
        assert screen.query_one("#sweep-itl", Plot).has_drawing
        await pilot.press("f7", "f8")
        await pilot.pause()
        data = json.loads((tmp_path / "sweep.json").read_text())
        assert [p["prompt_len"] for p in data["points"]] == [64, 256, 4096]
        csv_text = (tmp_path / "sweep.csv").read_text()
        assert csv_text.splitlines()[0].startswith("prompt_len,ok,error")
        assert len(SweepResult.rows_from_csv(csv_text)) == 3
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)


async def test_sweep_screen_explains_bad_input_and_opens_from_the_palette() -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await engine_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"sweep")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, SweepScreen))
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        screen.query_one("#runs", Input).value = "many"
        await pilot.press("f6")
        await pilot.pause()
        assert "not a whole number" in str(screen.query_one("#sweep-status").render())
        assert not screen.running
        await pilot.press("f7")
        await pilot.pause()
        assert "run a sweep first" in str(screen.query_one("#sweep-status").render())


def test_default_lengths_and_figures() -> None:
    card = ModelCard("m", "m", "bf16", 1, 1, 1, 2, 8192, 16, 1024, "cpu")
    assert default_prompt_lens(card, 128) == (512, 1024, 2048, 4096)
    assert default_prompt_lens(None, 128) == SweepConfig().prompt_lens
    points = [
        SweepPoint(
            512, True, None, SweepMetrics(mean_ttft_ms=10.0, median_itl_ms=5.0, p99_itl_ms=6.0)
        ),
        SweepPoint(
            1024, True, None, SweepMetrics(mean_ttft_ms=20.0, median_itl_ms=5.1, p99_itl_ms=6.2)
        ),
        SweepPoint(9999, False, "too long", None),
    ]
    ttft, itl = sweep_figures(points)
    assert ttft is not None
    assert ttft.series[0].ys == (10.0, 20.0)
    assert itl is not None
    assert len(itl.series) == 2


def test_run_label_and_eta() -> None:
    config = SweepConfig(prompt_lens=(512, 1024), runs=3, warmup=1)
    assert run_label(0, config) == "warm-up 1/1"
    assert run_label(1, config) == "512 tok, run 1/3"
    assert run_label(2, config) == "512 tok, run 2/3"
    assert run_label(4, config) == "1,024 tok, run 1/3"
    assert eta_seconds([], [512]) is None
    assert eta_seconds([(512, 2.0)], []) == 0.0
    # Runs of 512 took 2 s, of 1,024 took 4 s: three runs of 2,048 take about 24 s.
    eta = eta_seconds([(512, 2.0), (512, 2.0), (1024, 4.0)], [2048] * 3)
    assert eta is not None
    assert abs(eta - 24.0) < 1e-6


async def test_each_run_is_plotted_as_it_ends_with_a_run_line() -> None:
    from tui_helpers import HoldingClock

    # 16 output tokens: a request takes 17 steps; hold inside the second run.
    clock = HoldingClock(hold_after=25)
    app = make_app(clock=clock)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await engine_ready(pilot)
            await pilot.press("f5")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SweepScreen)
            for field_id, value in (
                ("lens", "64"),
                ("output-len", "16"),
                ("runs", "3"),
                ("warmup", "0"),
                ("concurrency", "1"),
            ):
                screen.query_one(f"#{field_id}", Input).value = value
            await pilot.press("f6")
            await wait_until(pilot, lambda: clock.holding, 30)
            await pilot.pause(0.2)
            assert len(screen.runs) == 1
            assert screen.points == []
            assert screen.query_one("#sweep-ttft", Plot).has_drawing
            line = str(screen.query_one("#sweep-run").render())
            assert line.startswith("64 tok, run 2/3 · about")
            clock.release()
            await wait_until(pilot, lambda: not screen.running, 30)
            status = str(screen.query_one("#sweep-status").render())
            # One length: singular, and counted from the result, not the table.
            assert status.startswith("Done: 1 prompt length measured.")
            assert len(screen.runs) == 3
    finally:
        clock.release()
