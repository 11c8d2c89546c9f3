"""EngineStatus: start-up progress, or why the engine is not running and how to retry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static

from engine.events import EngineState, LoadProgress

if TYPE_CHECKING:
    from textual.app import ComposeResult


class EngineStatus(Vertical):
    """Hidden while the engine is ready; otherwise a banner at the top of the chat."""

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Where the engine is in its life (see `engine.events.EngineState`)."""
    progress: reactive[LoadProgress | None] = reactive(None)
    """The last start-up stage reported by the engine."""
    error_text: reactive[str] = reactive("")
    """The typed error's plain() text, when failed or dead."""

    def compose(self) -> ComposeResult:
        yield Static("", id="engine-status-text")
        # No ETA: it is wall-clock, and start-up stages are not evenly long anyway.
        yield ProgressBar(total=1.0, show_eta=False, id="engine-status-bar")

    def on_mount(self) -> None:
        self._sync()

    def watch_engine_state(self) -> None:
        self._sync()

    def watch_progress(self) -> None:
        self._sync()

    def watch_error_text(self) -> None:
        self._sync()

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
            stage = self.progress.stage if self.progress else "starting"
            text.update(Text(f"Engine loading: {stage}…  The panels fill in when it is ready."))
            fraction = self.progress.fraction if self.progress else 0.0
            # No fraction yet (vLLM reports its stages only as they end): a pulsing bar,
            # not one that sits at 0% for the whole load.
            bar.update(total=1.0 if fraction > 0 else None, progress=fraction)
        elif state == "failed":
            text.update(Text(f"{self.error_text}\nPress ctrl+r to try starting the engine again."))
        elif state == "dead":
            text.update(Text(f"{self.error_text}\nPress ctrl+r to restart the engine."))
