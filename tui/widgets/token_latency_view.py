"""TokenLatencyView: a reply's tokens, each coloured by its own latency.

Append-only: a new token re-wraps nothing and repaints only the line it lands on, so a
long reply costs the same per token as a short one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rich.style import Style

FAST_RATIO = 1.5
SLOW_RATIO = 3.0


@dataclass(frozen=True, slots=True)
class TimedToken:
    text: str
    latency_s: float
    index: int


LEVELS = ("first", "fast", "slow", "stall")


def latency_level(token: TimedToken, median_s: float) -> str:
    """first (TTFT), fast (≤1.5× median ITL), slow (≤3×) or stall (more)."""
    if token.index == 0:
        return "first"
    if median_s <= 0 or token.latency_s <= median_s * FAST_RATIO:
        return "fast"
    if token.latency_s <= median_s * SLOW_RATIO:
        return "slow"
    return "stall"


def latency_text(tokens: Sequence[TimedToken], styles: Mapping[str, Style]) -> Text:
    """The tokens as one Text, each in its level's style (for a reply folded to text)."""
    itl = [t.latency_s for t in tokens if t.index > 0]
    median = statistics.median(itl) if itl else 0.0
    text = Text(end="")
    for token in tokens:
        text.append(token.text, styles[latency_level(token, median)])
    return text


class TokenLatencyView(Widget):
    """Renders a shared, growing list of tokens; call `sync()` after appending to it."""

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    TokenLatencyView {
        height: auto;
        width: 1fr;
    }
    TokenLatencyView > .token-latency-view--first { color: $accent; text-style: underline; }
    TokenLatencyView > .token-latency-view--fast { color: $success; }
    TokenLatencyView > .token-latency-view--slow { color: $warning; }
    TokenLatencyView > .token-latency-view--stall { color: $error; text-style: bold reverse; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"token-latency-view--{lvl}" for lvl in LEVELS}

    def __init__(
        self,
        tokens: list[TimedToken],
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._tokens = tokens
        # Each line is (position in `tokens`, text piece) pairs.
        self._lines: list[list[tuple[int, str]]] = [[]]
        self._line_width: list[int] = [0]
        self._consumed = 0
        self._wrap_width = 0
        self._median = 0.0
        self._median_at = 0

    # -- wrapping --------------------------------------------------------------------------
    def _rewrap(self, width: int) -> None:
        self._lines = [[]]
        self._line_width = [0]
        self._consumed = 0
        self._wrap_width = width
        self._median_at = 0
        self._consume()

    def _place(self, index: int, piece: str) -> None:
        width = self._wrap_width
        while piece:
            room = width - self._line_width[-1]
            size = cell_len(piece)
            if size <= room:
                self._lines[-1].append((index, piece))
                self._line_width[-1] += size
                return
            if self._line_width[-1] > 0 and size <= width:
                self._new_line()
                piece = piece.lstrip(" ")
                continue
            # Longer than a whole line: cut it.
            head, piece = piece[:room] if room else piece[:width], piece[room if room else width :]
            self._lines[-1].append((index, head))
            self._line_width[-1] += cell_len(head)
            if piece:
                self._new_line()

    def _new_line(self) -> None:
        self._lines.append([])
        self._line_width.append(0)

    def _consume(self) -> None:
        if self._wrap_width <= 0:
            return
        tokens = self._tokens
        while self._consumed < len(tokens):
            tok = tokens[self._consumed]
            parts = tok.text.split("\n")
            for i, part in enumerate(parts):
                if i:
                    self._new_line()
                if part:
                    self._place(self._consumed, part)
            self._consumed += 1
        # The median moves slowly; recomputing it on every token would make a long reply
        # quadratic, so it is refreshed as the reply doubles (and at least every 64 tokens).
        n = len(tokens)
        if n and (n >= 2 * self._median_at or n - self._median_at >= 64):
            itl = [t.latency_s for t in tokens if t.index > 0]
            self._median = statistics.median(itl) if itl else 0.0
            self._median_at = n

    def sync(self) -> None:
        """Take in tokens appended since the last call and repaint what changed."""
        if self._wrap_width <= 0:
            self.refresh(layout=True)
            return
        before = len(self._lines)
        self._consume()
        if len(self._lines) != before:
            self.refresh(layout=True)
        else:
            self.refresh(Region(0, before - 1, self._wrap_width, 1))

    def repaint_all(self) -> None:
        """Re-colour every token (the median may have moved), e.g. when shown again."""
        self._median_at = 0
        self._consume()
        self.refresh(layout=True)

    # -- Textual hooks ---------------------------------------------------------------------
    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._wrap_width:
            self._rewrap(width)
        else:
            self._consume()
        return max(1, len(self._lines))

    def on_resize(self) -> None:
        if self.content_size.width and self.content_size.width != self._wrap_width:
            self._rewrap(self.content_size.width)
            self.refresh(layout=True)

    def render_line(self, y: int) -> Strip:
        base = self.rich_style
        width = self.size.width
        if y >= len(self._lines):
            return Strip.blank(width, base)
        styles: dict[str, Style] = {
            lvl: base + self.get_component_rich_style(f"token-latency-view--{lvl}")
            for lvl in LEVELS
        }
        tokens = self._tokens
        segments = [
            Segment(piece, styles[latency_level(tokens[index], self._median)])
            for index, piece in self._lines[y]
        ]
        return Strip(segments).extend_cell_length(width, base).crop(0, width)
