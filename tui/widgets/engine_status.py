"""EngineStatus: start-up progress, or why the engine is not running and how to retry."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static

from engine.events import EngineState, LoadProgress

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.app import ComposeResult

PULSE_AFTER_S = 1.0
"""A stage with no news for this long pulses the bar. An engine says only where each stage
starts, and one stage can be most of the load (importing vLLM was 13 s of a 20 s CPU start,
all of it at 5 %): a bar held at the stage's share would read as stuck."""


class EngineStatus(Vertical):
    """Hidden while the engine is ready; otherwise a banner at the top of the chat."""

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Where the engine is in its life (see `engine.events.EngineState`)."""
    progress: reactive[LoadProgress | None] = reactive(None)
    """The last start-up stage reported by the engine."""
    error_text: reactive[str] = reactive("")
    """The typed error's plain() text, when failed or dead."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.clock: Callable[[], float] = time.monotonic
        """Where a stage's seconds are read from (a test holds it still)."""
        self._stage_since: float | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="engine-status-text")
        # No ETA: it is wall-clock, and start-up stages are not evenly long anyway.
        yield ProgressBar(total=1.0, show_eta=False, id="engine-status-bar")

    def on_mount(self) -> None:
        self._stage_since = self.clock()
        # The stage's seconds tick while it loads; nothing is redrawn once it is ready.
        self.set_interval(1.0, self._tick)
        self._sync()

    def _tick(self) -> None:
        if self.engine_state == "loading":
            self._sync()

    def watch_engine_state(self, state: EngineState) -> None:
        if state == "loading":
            self._stage_since = self.clock()
        self._sync()

    def watch_progress(self) -> None:
        self._stage_since = self.clock()
        self._sync()

    def watch_error_text(self) -> None:
        self._sync()

    def loading_words(self) -> str:
        """The banner's words while loading: the stage, its share and its seconds."""
        p = self.progress
        if p is not None and p.fraction >= 1.0:
            return "Engine loaded: the panels fill in now."
        stage = p.stage if p is not None else "starting"
        share = f" ({p.fraction:.0%})" if p is not None and p.fraction > 0 else ""
        seconds = self._seconds_in_stage()
        spent = f" {int(seconds)} s" if seconds >= 1 else ""
        # Two lines, so neither is cut at 80 columns: what runs, then what follows.
        return f"Engine loading{share}: {stage}…{spent}\nThe panels fill in when it is ready."

    def _seconds_in_stage(self) -> float:
        return 0.0 if self._stage_since is None else max(0.0, self.clock() - self._stage_since)

    def _sync(self) -> None:
        if not self.is_mounted:
            return
        state = self.engine_state
        self.display = state != "ready"
        for name in ("loading", "failed", "dead"):
            self.set_class(state == name, f"-{name}")
        text = self.query_one("#engine-status-text", Static)
        bar = self.query_one("#engine-status-bar", ProgressBar)
        bar.display = state == "loading"
        if state == "loading":
            text.update(Text(self.loading_words()))
            fraction = self.progress.fraction if self.progress else 0.0
            # No share yet, or a stage that has run a while: a pulsing bar, not one that
            # sits at 0 % (or 5 %) for most of the load; the words keep the share.
            pulse = fraction <= 0 or (fraction < 1 and self._seconds_in_stage() >= PULSE_AFTER_S)
            bar.update(total=None if pulse else 1.0, progress=fraction)
        elif state == "failed":
            text.update(Text(f"{self.error_text}\nPress ctrl+r to try starting the engine again."))
        elif state == "dead":
            text.update(Text(f"{self.error_text}\nPress ctrl+r to restart the engine."))
