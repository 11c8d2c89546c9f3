"""The sweep screen's roofline view (F3): the shown mode's points under the roofs, drawn
by the same plot as `kvscope roofline --plot`, in place of the usual plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from textual.widgets import Input, Static
from tui_helpers import engine_ready, make_app, settle, wait_until

from bench.load_result import LoadConfig, LoadPoint, LoadResult
from engine.events import ModelCard
from engine.nvml import GpuDevice
from roofline.point_perf import PointPerf, PointRoofline, PointRoofs, Unit
from tui.bench_roofline_plot import NO_FIGURES, PLOT_MARKS
from tui.roofline_figure import machine_roofs
from tui.screens.help import PANELS_TEXT
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
        assert "**Roofline of a sweep** (F3, on the sweep screen)" in PANELS_TEXT  # help says it
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


def _perf(flops: float, moved: float, unit: Unit = "steps") -> PointPerf:
    """One second of work: `flops` FLOP/s at `flops / moved` FLOPs per byte."""
    return PointPerf(flops, moved, 0.0, 1.0, 4, 4, unit, "vllm")


def _level(users: int, roofline: PointRoofline | None, *, ok: bool = True) -> LoadPoint:
    completed = 8 if ok else 0
    return LoadPoint(
        "concurrency", users, None, None, ok=ok, completed=completed, roofline=roofline
    )


BARE = "vLLM counts FLOPs only with --enable-mfu-metrics"
ROOFS = PointRoofs("the run's own roofs", 8e12, 40e9)  # the ridge at 200 FLOP/byte


async def test_f3_in_the_load_mode_draws_its_levels_or_says_which_have_no_counts() -> None:
    prefill, decode = _perf(2e12, 4e9), _perf(1.3e10, 1.35e10)
    in_process = PointRoofline(
        _perf(prefill.flops + decode.flops, prefill.read_bytes + decode.read_bytes),
        (("prefill", prefill), ("decode", decode)),
    )
    attached = PointRoofline(_perf(5e10, 2.5e10, "scrape windows"))
    levels = [
        _level(1, in_process),
        _level(2, attached),
        _level(4, PointRoofline(None, missing=BARE)),
        _level(8, in_process, ok=False),  # nothing completed: not a point
    ]
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _sweep_screen(pilot)
        await pilot.press("f4")
        await wait_until(pilot, lambda: screen.mode == "load")
        config = LoadConfig("concurrency", (1, 2, 4, 8))
        screen.load_pane.result = LoadResult(config, levels, roofs=ROOFS)
        await pilot.press("f3")
        await wait_until(pilot, lambda: "ridge" in _roofline(screen), what="the plot")
        text = _roofline(screen)
        assert "Roofline of this load sweep: 3 points" in text
        assert "roofs: the run's own roofs" in text and "ridge 200.0 FLOP/byte" in text
        assert all(PLOT_MARKS[kind] in text for kind in ("prefill", "decode", "point"))
        assert f"no FLOP and byte counts for 4 users: {BARE}" in text

        # No level counted: the plain words, no plot.
        screen.load_pane.result = LoadResult(config, [_level(1, None), _level(2, None)])
        await wait_until(pilot, lambda: "ridge" not in _roofline(screen), what="the words")
        assert _roofline(screen) == f"Roofline of this load sweep: {NO_FIGURES}."


def _card(device: str) -> ModelCard:
    return ModelCard("m", "m", "bfloat16", 1, 1, 64, 256, 2048, 16, 64, device)


@pytest.mark.parametrize(
    ("nvml_name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H200", "NVIDIA H200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB (SXM)"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", None),  # a slice: a share of the roofs
    ],
)
def test_a_live_runs_roofs_on_a_gpu_are_the_profile_nvml_names(
    monkeypatch: pytest.MonkeyPatch, nvml_name: str, profile: str | None
) -> None:
    import engine.nvml

    device = GpuDevice(0, nvml_name, 80 * 1024**3, 80 * 1024**3)
    monkeypatch.setattr(engine.nvml, "gpu_devices", lambda: [device])
    roofs = machine_roofs(_card("cuda"))
    if profile is None:
        assert roofs == f"no shipped profile for this GPU ({nvml_name}): its roofs are not known"
    else:
        assert not isinstance(roofs, str) and roofs.name == profile, roofs


def test_a_live_runs_roofs_on_a_cpu_are_its_calibration_never_measured_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import roofline.cpu_calibration
    import roofline.hardware

    def measure(*_: object, **__: object) -> None:
        raise AssertionError("the roofs were measured: seconds of every core")

    monkeypatch.setattr(roofline.cpu_calibration, "load_cached_cpu_profile", lambda: None)
    for module in (roofline.cpu_calibration, roofline.hardware):
        monkeypatch.setattr(module, "calibrate_cpu", measure)
    roofs = machine_roofs(_card("cpu"))
    assert isinstance(roofs, str) and "`kvscope roofline --gpu cpu` measures them" in roofs
    fake = machine_roofs(_card("fake"))
    assert not isinstance(fake, str) and fake.name == "the fake's set machine"


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
