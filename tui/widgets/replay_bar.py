"""ReplayBar: where a replay is on its tape, in one line:
"record 118 / 526 · engine step 340 · 1x · playing".

Two numbers, each named: the tape's step records handed over (what `replay --at` counts)
and the engine's own number of the last one (what the Engine panel's status line says).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

if TYPE_CHECKING:
    from engine.replay import ReplayPosition

FILLED = "━"
EMPTY = "─"
MIN_BAR = 8
"""Narrower than this, the bar is left out: the words matter more than the picture."""


def state_words(position: ReplayPosition) -> str:
    if position.ended:
        return "end of tape"
    return "paused" if position.paused else "playing"


def speed_words(speed: float) -> str:
    """1x, 4x, 0.5x: the speed as a presenter says it."""
    return f"{speed:g}x"


def clock_words(seconds: float) -> str:
    """Tape time as m:ss.s, short enough to sit in the bar at 80 columns."""
    minutes, rest = divmod(max(0.0, seconds), 60.0)
    return f"{int(minutes)}:{rest:04.1f}"


def where_words(position: ReplayPosition) -> str:
    """ "record 61 / 705 · engine step 580": the tape's step records played (what `--at`
    counts), and the engine's number of the last one (the status line's)."""
    words = f"record {position.position:,} / {position.length:,}"
    if position.position:
        words += f" · engine step {position.step:,}"
    return words


def bar_words(position: ReplayPosition) -> str:
    """The bar's words without the picture (for tests, and the widest part of it)."""
    return f"{where_words(position)} · {speed_words(position.speed)} · {state_words(position)}"


class ReplayBar(Widget):
    """One line under the panels: the replay's step, speed and state, its tape time, and a
    bar that fills as it plays. It draws what the replay's position listener last said.

    It is laid out in the flow, not docked: two widgets docked at one edge (it and the
    footer) would be drawn over each other."""

    DEFAULT_CSS = """
    ReplayBar {
        height: 1;
        padding: 0 1;
        background: $panel;
        color: $text;
    }
    ReplayBar > .replay-bar--filled {
        color: $accent;
    }
    ReplayBar > .replay-bar--empty {
        color: $foreground-muted;
    }
    ReplayBar > .replay-bar--state {
        text-style: bold;
    }
    """
    COMPONENT_CLASSES = {  # noqa: RUF012 (Textual declares it without ClassVar)
        "replay-bar--filled",
        "replay-bar--empty",
        "replay-bar--state",
    }

    can_focus = True  # focused, the footer lists the replay's keys first, not a scroller's

    position: reactive[ReplayPosition | None] = reactive(None)
    """The replay's position, from its position listener (None before it is ready)."""

    def __init__(
        self,
        tape_name: str = "",
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.tape_name = tape_name

    @property
    def words(self) -> str:
        """What the bar says, as plain text (for tests)."""
        return "" if self.position is None else bar_words(self.position)

    def render(self) -> Text:
        position = self.position
        if position is None:
            return Text(f"replay · {self.tape_name} · reading the tape…")
        glyph = "■" if position.ended else ("‖" if position.paused else "▶")
        text = Text()
        text.append(f"{glyph} replay · {where_words(position)} · ")
        text.append(f"{speed_words(position.speed)} · ")
        text.append(state_words(position), self.get_component_rich_style("replay-bar--state"))
        times = f"  {clock_words(position.time_s)} / {clock_words(position.duration_s)}"
        room = self.content_size.width - text.cell_len - len(times) - 2
        if room >= MIN_BAR:
            done = position.position / position.length if position.length else 1.0
            filled = round(done * room)
            text.append("  ")
            text.append(FILLED * filled, self.get_component_rich_style("replay-bar--filled"))
            text.append(EMPTY * (room - filled), self.get_component_rich_style("replay-bar--empty"))
        if self.content_size.width - text.cell_len >= len(times):
            text.append(times)
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text
