"""GPU telemetry from NVML (a stand-in module here: no NVIDIA driver on the test machine)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import types
from types import SimpleNamespace
from typing import TYPE_CHECKING

from engine.nvml import gpu_readings, process_tree

if TYPE_CHECKING:
    import pytest

    from engine.events import ModelCard, ProgressCallback

GIB = 1024**3


def _nvml_with_one_gpu(*, power_supported: bool = True) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA L4"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(  # type: ignore[attr-defined]
        total=24 * GIB, used=20 * GIB, free=4 * GIB
    )
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # type: ignore[attr-defined]
        SimpleNamespace(pid=os.getpid(), usedGpuMemory=18 * GIB),
        SimpleNamespace(pid=999_999, usedGpuMemory=1 * GIB),
    ]
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=87, memory=40)  # type: ignore[attr-defined]

    def power(h: object) -> int:
        if not power_supported:
            raise RuntimeError("NVMLError_NotSupported")
        return 71_500  # milliwatts

    m.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, kind: 2_040  # type: ignore[attr-defined]
    return m


def test_a_reading_splits_memory_between_kvscope_and_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml_with_one_gpu())
    readings = gpu_readings({os.getpid()})
    assert not isinstance(readings, str)
    (gpu,) = readings
    assert (gpu.ours_bytes, gpu.others_bytes) == (18 * GIB, 1 * GIB)
    assert gpu.words() == (
        "GPU 0 NVIDIA L4: 20.0 of 24.0 GiB (kvscope 18.0, others 1.0) · util 87 % · 72 W · "
        "SM 2,040 MHz"
    )


def test_a_field_the_gpu_does_not_report_is_left_out_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml_with_one_gpu(power_supported=False))
    readings = gpu_readings({os.getpid()})
    assert not isinstance(readings, str)
    (gpu,) = readings
    assert gpu.power_w is None and " W " not in gpu.words()


def test_without_nvml_the_answer_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    said = gpu_readings({os.getpid()})
    assert said == "no GPU telemetry: NVML found no NVIDIA driver here"


def test_the_process_tree_holds_the_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= process_tree(os.getpid())
        assert child.pid not in process_tree(child.pid + 10_000_000)
    finally:
        child.kill()
        child.wait()


def _says(widget: object, words: str) -> bool:
    from textual.widgets import Static

    return isinstance(widget, Static) and words in str(widget.render())


async def test_the_engine_panel_shows_the_gpu_line_only_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from tui_helpers import WIDE, engine_ready, make_app, wait_until

    from engine.fake import FakeEngine
    from tui.widgets.gpu_telemetry_line import GpuTelemetryLine

    monkeypatch.setitem(sys.modules, "pynvml", _nvml_with_one_gpu())

    class OnCuda(FakeEngine):
        def start(self, progress: ProgressCallback | None = None) -> ModelCard:
            self._card = dataclasses.replace(super().start(progress), device="cuda")
            return self._card

    engines: tuple[tuple[FakeEngine, bool], ...] = ((OnCuda(), True), (FakeEngine(), False))
    for engine, shown in engines:
        app = make_app(engine=engine)
        async with app.run_test(size=WIDE) as pilot:
            await engine_ready(pilot)
            line = app.main_screen.query_one(GpuTelemetryLine)
            if shown:
                await wait_until(pilot, functools.partial(_says, line, "NVIDIA L4"))
                assert line.display
                assert "(kvscope 18.0, others 1.0) · util 87 %" in str(line.render())
            else:
                await pilot.pause()
                assert not line.display
