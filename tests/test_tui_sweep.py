"""The sweep screen: runs bench.sweep.run_sweep on the fake, plots and exports points."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from textual.content import Content
from textual.widgets import DataTable, Input, Static
from tui_helpers import HoldingClock, engine_ready, make_app, palette_offers, settle, wait_until

from bench.sweep_files import SavedSweep, SweepFileError, load_saved_sweeps
from bench.sweep_result import SweepConfig, SweepMetrics, SweepPoint, SweepResult
from engine.events import ModelCard
from tui.sweep.overlay import OVERLAY_ROLE, Overlay, ratio_line
from tui.sweep.prompt_view_model import (
    default_prompt_lens,
    eta_seconds,
    parse_lens,
    run_label,
    sweep_figures,
)
from tui.sweep.screen import SweepScreen
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from tui.plotting import Figure, Series


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
        await wait_until(
            pilot,
            lambda: (
                screen.query_one(DataTable).row_count == 3
                and screen.query_one("#sweep-ttft", Plot).has_drawing
                and screen.query_one("#sweep-itl", Plot).has_drawing
            ),
            what="the table and both plots to show the 3 points",
        )
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
        await palette_offers(pilot, "Prompt-length sweep")
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
            await settle(pilot)  # the held state drawn: not however far 0.2 s got
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


# -- a saved sweep overlaid on the live one (issue #11) ----------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "sweep"
SAVED = FIXTURES / "saved.json"  # 64/128/256 tokens: TTFT 10/20/40 ms, ITL 40/40/50 ms
COMPARE = FIXTURES / "compare.json"  # A is SAVED; B: TTFT 12/30/60 ms, ITL 80/80/100 ms


def _overlaid(figure: Figure | None, marker: str) -> Series:
    """The one series of `figure` drawn with the overlay's colour and `marker`."""
    assert figure is not None
    found = [s for s in figure.series if s.role == OVERLAY_ROLE and s.marker == marker]
    assert len(found) == 1, figure.series
    return found[0]


def _text(screen: SweepScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def _key(screen: SweepScreen, box: str) -> str:
    """A chart box's key (its border subtitle), as read on screen."""
    return Content.from_markup(str(screen.query_one(box).border_subtitle)).plain


async def _open_sweep(pilot: Pilot[int]) -> SweepScreen:
    await engine_ready(pilot)
    await pilot.press("f5")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, SweepScreen)
    return screen


async def _load(pilot: Pilot[int], screen: SweepScreen, path: Path | str) -> str:
    """Type `path`, press F9, wait for the load; the status line after it."""
    screen.query_one("#load-path", Input).value = str(path)
    await pilot.press("f9")
    await wait_until(
        pilot, lambda: all(w.is_finished for w in pilot.app.workers if w.group == "load")
    )
    await pilot.pause()
    return _text(screen, "#sweep-status")


async def test_a_saved_sweep_is_overlaid_before_any_run() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open_sweep(pilot)
        assert "F9" in str(screen.query_one("#load").render())
        status = await _load(pilot, screen, SAVED)
        assert status == "Loaded saved.json: 3 prompt lengths, drawn as ◆."
        assert not screen.query_one("#sweep-status").has_class("-error")
        assert screen.overlay is not None
        # Alone on the charts: the loaded means and medians, with their own glyph and colour.
        ttft, itl = sweep_figures(screen.points, screen.runs, overlay=screen.overlay)
        assert [(s.role, s.marker) for s in ttft.series] == [(OVERLAY_ROLE, "◆")]  # type: ignore[union-attr]
        saved_ttft, saved_itl = _overlaid(ttft, "◆"), _overlaid(itl, "◆")
        assert saved_ttft.xs == (64.0, 128.0, 256.0)  # the failed 4,096 is not drawn
        assert saved_ttft.ys == (10.0, 20.0, 40.0)
        assert saved_itl.ys == (40.0, 40.0, 50.0)
        await wait_until(pilot, lambda: screen.query_one("#sweep-ttft", Plot).has_drawing)
        assert screen.query_one("#sweep-itl", Plot).has_drawing
        legend = _text(screen, "#sweep-overlay")
        assert "Overlaid: saved.json, a saved sweep" in legend
        assert "◆ fake/SmolLM2-135M-Instruct · 16 output tokens · 1 run a length" in legend
        assert "live / ◆: run a sweep to compare" in legend
        assert _key(screen, "#sweep-itl-box").endswith("roofline floor  ◆ loaded")


async def test_loading_during_a_run_then_the_ratios_to_the_live_run() -> None:
    clock = HoldingClock(hold_after=25)  # inside the second length's run
    app = make_app(clock=clock)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await _open_sweep(pilot)
            for field_id, value in (
                ("lens", "64 128 512"),
                ("output-len", "16"),
                ("runs", "1"),
                ("warmup", "0"),
                ("concurrency", "1"),
            ):
                screen.query_one(f"#{field_id}", Input).value = value
            await pilot.press("f6")
            await wait_until(pilot, lambda: clock.holding, 30)
            await pilot.pause(0.2)
            await _load(pilot, screen, SAVED)
            assert screen.running
            assert screen.overlay is not None
            ttft, _ = sweep_figures(screen.points, screen.runs, overlay=screen.overlay)
            assert _overlaid(ttft, "◆").ys == (10.0, 20.0, 40.0)
            clock.release()
            await wait_until(pilot, lambda: not screen.running and len(screen.points) == 3, 30)
            await pilot.pause(0.2)
            # Live over saved at the two lengths both measured (512 was never saved).
            live = {p.prompt_len: p for p in screen.points}
            expected = " · ".join(
                f"{n:,} tok: TTFT {(live[n].value('mean_ttft_ms') or 0) / ttft_ms:.2f}x, "
                f"ITL {(live[n].value('median_itl_ms') or 0) / itl_ms:.2f}x"
                for n, ttft_ms, itl_ms in ((64, 10.0, 40.0), (128, 20.0, 40.0))
            )
            assert f"live / ◆  {expected}\n" in _text(screen, "#sweep-overlay") + "\n"
            # The overlay is still in the charts next to the live points.
            ttft, itl = sweep_figures(screen.points, screen.runs, overlay=screen.overlay)
            assert _overlaid(itl, "◆").ys == (40.0, 40.0, 50.0)
            assert ttft is not None
            assert any(s.role == "series" and s.marker == "•" for s in ttft.series)
    finally:
        clock.release()


def _point(n: int, ttft: float, itl: float) -> SweepPoint:
    return SweepPoint(n, True, None, SweepMetrics(mean_ttft_ms=ttft, median_itl_ms=itl))


def test_ratio_line_for_a_known_fixture() -> None:
    (saved,) = load_saved_sweeps(SAVED)
    live = [_point(256, 20.0, 25.0), _point(64, 15.0, 50.0), _point(512, 99.0, 9.0)]
    config = SweepConfig(prompt_lens=(64, 256, 512), output_len=16)
    assert ratio_line(live, config, saved, "◆") == (
        "live / ◆  64 tok: TTFT 1.50x, ITL 1.25x · 256 tok: TTFT 0.50x, ITL 0.50x"
    )
    other = SweepConfig(prompt_lens=(64, 256, 512), output_len=32)
    assert ratio_line(live, other, saved, "◆").endswith(
        "(output lengths differ: 32 live, 16 saved)"
    )
    assert ratio_line([_point(512, 1.0, 1.0)], config, saved, "◆") == (
        "live / ◆: no prompt length in common yet (saved: 64, 128, 256)"
    )


def _write(folder: Path, name: str, data: object) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _bad_files(folder: Path) -> list[tuple[Path | str, str]]:
    """(what is typed in the path field, the words the status must say)."""
    good = json.loads(SAVED.read_text())
    no_points = {k: v for k, v in good.items() if k != "points"}
    no_runs = {**good, "config": {k: v for k, v in good["config"].items() if k != "runs"}}
    nameless = {**good, "points": [{k: v for k, v in good["points"][0].items() if k != "ok"}]}
    words = {**good, "points": [{**good["points"][0], "mean_ttft_ms": "fast"}]}
    failed = {**good, "points": [p for p in good["points"] if not p["ok"]]}
    compare = json.loads(COMPARE.read_text())
    del compare["compare"]["B"]["config"]
    return [
        ("", "Give the path of a saved sweep (.json) to compare with."),
        (folder / "nope.json", f"Cannot load {folder / 'nope.json'}: there is no such file."),
        (folder, "it is a folder, not a file."),
        (_write(folder, "notes.json", "TTFT went up\n"), "it is not JSON (line 1, column 1"),
        (_write(folder, "list.json", [1, 2]), "not a sweep result: the file is not a JSON object."),
        (
            _write(folder, "no-points.json", no_points),
            'it is not a sweep result: the file has no "points" key.',
        ),
        (
            _write(folder, "no-runs.json", no_runs),
            'it is not a sweep result: the file\'s "config" has no "runs" key.',
        ),
        (
            _write(folder, "no-ok.json", nameless),
            'it is not a sweep result: point 1 of the file has no "ok" key.',
        ),
        (
            _write(folder, "words.json", words),
            "point 1 of the file has \"mean_ttft_ms\": 'fast', not a number.",
        ),
        (
            _write(folder, "b-broken.json", compare),
            'it is not a sweep result: config B has no "config" key.',
        ),
        (
            _write(folder, "failed.json", failed),
            "it holds no measured point (its one prompt length failed).",
        ),
        (
            _write(folder, "empty.json", {**good, "points": []}),
            "it holds no measured point (its list of points is empty).",
        ),
    ]


async def test_bad_files_say_why_and_the_screen_keeps_everything(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open_sweep(pilot)
        await _load(pilot, screen, SAVED)
        overlay = screen.overlay
        assert overlay is not None
        legend = _text(screen, "#sweep-overlay")
        for path, words in _bad_files(tmp_path):
            status = await _load(pilot, screen, path)
            assert words in status, (path, status)
            assert "\n" not in status
            assert screen.query_one("#sweep-status").has_class("-error")
            # Nothing lost: the overlay loaded before, its legend and its series.
            assert screen.overlay is overlay
            assert _text(screen, "#sweep-overlay") == legend
            ttft, _ = sweep_figures(screen.points, screen.runs, overlay=screen.overlay)
            assert _overlaid(ttft, "◆").ys == (10.0, 20.0, 40.0)
        # Still usable: the next good file loads, and clears the error.
        status = await _load(pilot, screen, COMPARE)
        assert status.startswith("Loaded compare.json")
        assert not screen.query_one("#sweep-status").has_class("-error")


@pytest.mark.parametrize("case", range(12))
def test_each_bad_file_is_refused_by_the_loader(tmp_path: Path, case: int) -> None:
    path, words = _bad_files(tmp_path)[case]
    if path == "":
        return  # the empty field is the screen's to refuse
    with pytest.raises(SweepFileError) as caught:
        load_saved_sweeps(Path(path))
    assert words in caught.value.plain()


async def test_a_compare_file_overlays_both_configs() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open_sweep(pilot)
        status = await _load(pilot, screen, COMPARE)
        assert status == "Loaded compare.json: configs A and B, 3 prompt lengths, drawn as ◆ and ◇."
        overlay = screen.overlay
        assert overlay is not None
        assert [(s.label, s.flags) for s in overlay.sweeps] == [
            ("A", "--max-num-batched-tokens 256"),
            ("B", "--max-num-batched-tokens 2048"),
        ]
        ttft, itl = sweep_figures(screen.points, screen.runs, overlay=overlay)
        assert _overlaid(ttft, "◆").ys == (10.0, 20.0, 40.0)
        assert _overlaid(ttft, "◇").ys == (12.0, 30.0, 60.0)
        assert _overlaid(itl, "◇").ys == (80.0, 80.0, 100.0)
        legend = _text(screen, "#sweep-overlay")
        assert "Overlaid: compare.json, both configs (A, B) of a bench --compare file" in legend
        assert "◆ config A: --max-num-batched-tokens 256 · fake/SmolLM2" in legend
        assert "◇ config B: --max-num-batched-tokens 2048 · fake/SmolLM2" in legend
        assert _key(screen, "#sweep-ttft-box").endswith("roofline floor  ◆ A  ◇ B")


def test_overlay_only_figures_and_both_in_one_axis() -> None:
    saved = SavedSweep("", SweepResult.from_json(SAVED.read_text()))
    overlay = Overlay(SAVED, (saved,))
    assert sweep_figures([], None) == (None, None)
    ttft, itl = sweep_figures([], None, overlay=overlay)
    assert ttft is not None
    assert itl is not None
    # One axis for both: the saved 256 stays in view next to a live 64 alone.
    for figure in sweep_figures([_point(64, 5.0, 5.0)], None, overlay=overlay):
        assert figure is not None
        assert figure.xaxis is not None
        assert figure.xaxis.hi >= 256
