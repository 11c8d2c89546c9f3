"""GpuTelemetryLine: each GPU's memory (kvscope's and everyone else's), load, power and
clock, from NVML once a second, beside the KV pool on a GPU box."""

from __future__ import annotations

import os
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.reactive import reactive
from textual.widgets import Static

from engine.nvml import gpu_readings, process_tree

READ_EVERY_S = 1.0  # NVML's utilisation is itself an average over about a second


class GpuTelemetryLine(Static):
    """Hidden until `active` (the engine runs on CUDA); then one line per GPU, or the one
    line that says why there is no telemetry."""

    DEFAULT_CSS: ClassVar[str] = """
    GpuTelemetryLine { height: auto; color: $text-muted; display: none; }
    GpuTelemetryLine.-active { display: block; }
    """

    active: reactive[bool] = reactive(False)
    """The engine runs on an NVIDIA GPU: read NVML and show it."""

    def on_mount(self) -> None:
        self.set_interval(READ_EVERY_S, self._tick)

    def watch_active(self, active: bool) -> None:
        self.set_class(active, "-active")
        if active:
            self._read()

    def _tick(self) -> None:
        if self.active:
            self._read()

    @work(thread=True, group="gpu-telemetry", exclusive=True, exit_on_error=False)
    def _read(self) -> None:
        # NVML calls block for a few milliseconds per GPU: off the event loop.
        readings = gpu_readings(process_tree(os.getpid()))
        text = readings if isinstance(readings, str) else "\n".join(r.words() for r in readings)
        self.app.call_from_thread(self.update, Text(text or "no GPU listed by NVML"))
