"""The sweep screen's roofline view (F3): the shown mode's points under the roofs, drawn
by the same plot as `kvscope roofline --plot`, in place of the usual plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from textual.widgets import Input, Static
from tui_helpers import engine_ready, make_app, settle, wait_until

from tui.bench_roofline_plot import PLOT_MARKS
from tui.sweep.screen import SweepScreen
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from textual.pilot import Pilot

SAVED = Path(__file__).parent / "fixtures" / "sweep" / "roofline.json"
"""`kvscope bench --fake --prompt-lens 64,512 --output-len 8 --runs 1 --json`: two points
with FLOP and byte counts, prefill and decode apart, under the fake's set machine."""


def _shown(screen: SweepScreen, widget_id: str) -> bool:
    return screen.query_one(widget_id).display


def _roofline(screen: SweepScreen) -> str:
    return str(screen.query_one("#sweep-roofline", Static).content)


async def _sweep_screen(pilot: Pilot[int]) -> SweepScreen:
    await engine_ready(pilot)
    await pilot.press("f5")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, SweepScreen))
    screen = pilot.app.screen
    assert isinstance(screen, SweepScreen)
    return screen


async def _load(pilot: Pilot[int], screen: SweepScreen, path: Path | str) -> None:
    screen.query_one("#load-path", Input).value = str(path)
    await pilot.press("f9")
    await wait_until(pilot, lambda: screen.overlay is not None, what="the file to load")


async def test_f3_draws_a_saved_bench_under_its_roofs_and_back(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _sweep_screen(pilot)
        assert any(b.key == "f3" and b.description == "Roofline" for b in screen.BINDINGS)  # type: ignore[union-attr]
        await pilot.press("f3")
        await wait_until(pilot, lambda: "no point yet" in _roofline(screen))
        assert not _shown(screen, "#sweep-ttft-box") and not _shown(screen, "#sweep-itl-box")

        await _load(pilot, screen, SAVED)
        await wait_until(pilot, lambda: "ridge" in _roofline(screen), what="the plot")
        text = _roofline(screen)
        assert "Roofline of the points of roofline.json: 2 points" in text
        assert "roofs: the fake's set machine" in text
        assert "ridge 125.0 FLOP/byte" in text
        assert PLOT_MARKS["prefill"] in text and PLOT_MARKS["decode"] in text
        assert "no FLOP and byte counts" not in text

        # Back: the usual plots, drawn.
        await pilot.press("f3")
        await wait_until(pilot, lambda: _shown(screen, "#sweep-ttft-box"))
        assert not _shown(screen, "#sweep-roofline-box")
        await wait_until(pilot, lambda: screen.query_one("#sweep-itl", Plot).has_drawing)

        # A file whose points have figures but no counts: the plain words, no plot.
        data = json.loads(SAVED.read_text())
        for point in data["points"]:
            point["roofline"] = {"missing": "vLLM counts FLOPs only with --enable-mfu-metrics"}
        bare = tmp_path / "bare.json"
        bare.write_text(json.dumps(data))
        await _load(pilot, screen, bare)
        await pilot.press("f3")
        await wait_until(pilot, lambda: "bare.json" in _roofline(screen))
        text = _roofline(screen)
        assert (
            "no point has FLOP and byte counts: vLLM counts FLOPs only with "
            "--enable-mfu-metrics" in text
        )
        assert "ridge" not in text


async def test_f3_follows_a_live_sweep_as_its_points_land() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _sweep_screen(pilot)
        for field_id, value in (
            ("lens", "64 256"),
            ("output-len", "8"),
            ("runs", "1"),
            ("warmup", "0"),
            ("concurrency", "1"),
        ):
            screen.query_one(f"#{field_id}", Input).value = value
        await pilot.press("f3", "f6")
        await wait_until(pilot, lambda: len(screen.points) == 2 and not screen.running, 30)
        await wait_until(pilot, lambda: "2 points" in _roofline(screen), what="both points")
        text = _roofline(screen)
        assert "Roofline of this prompt-length sweep" in text
        assert "ridge 125.0 FLOP/byte" in text
        assert PLOT_MARKS["prefill"] in text and PLOT_MARKS["decode"] in text


def test_snapshot_of_the_roofline_view(snap_compare, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Relative to the test's working folder: no machine's own path in the SVG.
    monkeypatch.chdir(SAVED.parent)

    async def before(pilot: Pilot[int]) -> None:
        screen = await _sweep_screen(pilot)
        await _load(pilot, screen, SAVED.name)
        await pilot.press("f3")
        await wait_until(pilot, lambda: "ridge" in _roofline(screen))
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=(160, 48), run_before=before)


def test_the_plot_module_imports_no_textual() -> None:
    code = "import sys, tui.bench_roofline_plot, cli.roofline; sys.exit('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
