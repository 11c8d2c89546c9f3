"""ShuttingDownScreen: what the user sees while the engine stops, after Ctrl+Q.

Stopping the real engine takes seconds (the step thread finishes its step, vLLM frees
its memory). A blank terminal for that long looks like a hang, so the app says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import Center, Middle
from textual.screen import ModalScreen
from textual.widgets import Static

if TYPE_CHECKING:
    from textual.app import ComposeResult

SHUTTING_DOWN = "shutting down the engine…"


class ShuttingDownScreen(ModalScreen[None]):
    """A centred notice; Ctrl+Q again leaves at once (handled by the app)."""

    DEFAULT_CSS = """
    ShuttingDownScreen {
        align: center middle;
        background: $background 60%;
    }
    ShuttingDownScreen #shutdown-box {
        width: auto;
        height: auto;
        padding: 1 3;
        border: round $primary;
        background: $surface;
    }
    """

    def compose(self) -> ComposeResult:
        with Middle(), Center():
            yield Static(f"{SHUTTING_DOWN}\n(ctrl+q again leaves at once)", id="shutdown-box")
