"""LiveMarkdown: one widget that draws a streaming reply's Markdown line by line.

Textual's `Markdown` is a widget per block. Under a fast stream every new paragraph is a
mount, and a mount renumbers the paint order of everything on screen before it, so the
whole transcript is drawn again; each block's growth is a layout of the screen, and each
layout is followed by a second one (Textual re-lays out a widget whose virtual size
changed). Those frames were what kept `benchmarks/ui_lag.py` over 16 ms.

Here the reply is one Line-API widget that keeps its own rendered lines:
- finished blocks (ended by a blank line, outside a code fence) are rendered once, by
  rich's Markdown renderer, the one a folded reply uses, so a reply looks the same while
  it streams, when it ends and once folded;
- only the last block is rendered again when text arrives, and only its rows repaint;
- the widget keeps some empty rows below the text while it streams (a reserve). Text that
  still fits repaints its rows alone; only a step of the reserve lays the screen out (and
  scrolls the transcript, which repaints all of it). Each step is sized to last about two
  seconds at the rate the text has been growing, up to half the screen, so a fast stream
  scrolls a few times in ten seconds and a slow one keeps only a line or two of room.
  `settle()` gives the room back when the reply ends.
"""

from __future__ import annotations

import math

from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from tui.widgets.single_layout import SingleLayout

RESERVE_START = 4
"""Empty lines kept under the streaming text at first."""
RESERVE_MIN = 2
RESERVE_SHARE = 2
"""A step is at most half the screen's rows, so the newest text stays in view."""
STEP_EVERY_S = 2.0
"""A step holds this long at the rate the text grew since the last one."""

FENCES = ("```", "~~~")
CODE_THEME = "monokai"
"""rich's Markdown's default for code blocks, which folded replies use too."""
CODE_CHUNK = 16
"""Lines of an open code fence highlighted together, once: re-highlighting the whole
fence on every append cost 32 ms at 100 lines and 81 ms at 300 (rich, width 60)."""


def _fence_marker(line: str) -> str | None:
    """The fence a line opens or closes (` ``` ` or `~~~`, with its length), if any."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3:
        return None  # indented four or more: code, not a fence
    for fence in FENCES:
        if stripped.startswith(fence):
            return stripped[: len(stripped) - len(stripped.lstrip(fence[0]))]
    return None


def _list_item(line: str) -> bool:
    """Whether a line (at the margin) starts a list item: a blank line before it may
    only separate two items of one (loose) list."""
    if line[:2] in ("- ", "* ", "+ "):
        return True
    digits = len(line) - len(line.lstrip("0123456789"))
    return 0 < digits < 10 and line[digits : digits + 2] in (". ", ") ")


class BlockSplitter:
    """Finds where finished top-level Markdown blocks end in text that only grows.

    A block ends at a blank line outside a code fence, once the next line shows it does
    not go on: a list goes on with another item or an indented line, an indented code
    block with another indented line. Deciding on whole lines only is enough: a block is
    held back for at most one line.
    """

    def __init__(self) -> None:
        self.stable_end = 0
        """Where the finished blocks end in the text (the live block starts here)."""
        self._pos = 0  # start of the first line not looked at yet
        self._fence: str | None = None
        self._blank_at: int | None = None  # start of the blank line that may end a block
        self._kind = ""  # the live block's: "list", "code", "other"; "" before its text
        self._fence_at = -1  # where the line that opened the open fence starts

    def feed(self, text: str) -> list[str]:
        """Look at the whole lines of `text` not seen yet; return the blocks they ended."""
        finished: list[str] = []
        while (end := text.find("\n", self._pos)) != -1:
            start, self._pos = self._pos, end + 1
            line = text[start:end]
            if self._fence is not None:
                marker = _fence_marker(line)
                if (
                    marker
                    and marker[0] == self._fence[0]
                    and len(marker) >= len(self._fence)
                    and not line.strip().lstrip(marker[0])
                ):
                    self._fence = None  # a closing fence: nothing after its marks
                continue
            if not line.strip():
                if self._kind and self._blank_at is None:
                    self._blank_at = start
                continue
            stripped = line.lstrip(" ")
            indent = len(line) - len(stripped)
            if self._blank_at is not None and not self._goes_on(indent, stripped):
                finished.append(text[self.stable_end : self._blank_at])
                self.stable_end = start
                self._kind = ""
            self._blank_at = None
            if not self._kind:
                if indent >= 4:
                    self._kind = "code"
                else:
                    self._kind = "list" if _list_item(stripped) else "other"
            self._fence = _fence_marker(line)
            self._fence_at = start
        return finished

    @property
    def open_fence(self) -> str | None:
        """The marks of the code fence that opens the live block and is still open (None
        when the live block starts otherwise, e.g. a line of text before its fence)."""
        return self._fence if self._fence_at == self.stable_end else None

    def _goes_on(self, indent: int, stripped: str) -> bool:
        """Whether a line after a blank one continues the live block."""
        if self._kind == "list":
            return indent >= 2 or (indent < 4 and _list_item(stripped))
        return self._kind == "code" and indent >= 4


class LiveMarkdown(SingleLayout, Widget):
    """Markdown for a reply that is still streaming (see the module's docstring)."""

    DEFAULT_CSS = """
    LiveMarkdown {
        height: auto;
    }
    """

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._text = ""
        self._splitter = BlockSplitter()
        self._blocks: list[str] = []
        self._width = 0
        self._stable: list[list[Segment]] = []  # the finished blocks' lines, at _width
        self._live: list[list[Segment]] = []  # the last block's lines, at _width
        self._reserved = 0
        self._step_owed: float | None = None  # text came before the first layout, at this time
        self._step_lines = RESERVE_START
        self._last_step: tuple[float, int] | None = None  # when, and the text's lines then
        self._line_style = Style()
        # An open fence's whole chunks of CODE_CHUNK lines, highlighted once, at _width.
        self._code_chunks: list[list[list[Segment]]] = []

    @property
    def text_lines(self) -> int:
        """Rows the text takes at the current width (the reserve not counted)."""
        return len(self._stable) + len(self._live)

    @property
    def reserved(self) -> int:
        return self._reserved

    # -- growing ---------------------------------------------------------------------------
    def append_live(self, markdown: str, made_at: float) -> None:
        """Append `markdown`, whose last token the engine made at `made_at` (its own clock):
        repaint the rows it changed, or lay out for a new step. The reserve follows the
        engine's pace, not when the UI drew: the same stream gets the same room on any
        machine, and a test on a virtual clock draws the same screen every run."""
        if not markdown:
            return
        self._text += markdown
        first_changed = len(self._stable)
        before = self.text_lines
        finished = self._splitter.feed(self._text)
        self._blocks += finished
        width = self._width
        if not width:
            # Not laid out yet: get_content_height renders, and takes the step then, so
            # the reserve does not depend on whether text came before the first layout.
            self._step_owed = made_at
            self.refresh(layout=True)
            return
        for block in finished:
            self._stable += self._separated(self._render_markdown(block, width))
        if finished:
            self._code_chunks = []
        self._live = self._separated(self._render_live(width))
        lines = self.text_lines
        if self._step_due():
            self._reserved = lines + self._next_step(made_at)
            self.refresh(layout=True)
        else:
            rows = max(lines, before) - first_changed
            self.refresh(Region(0, first_changed, width, rows))

    def _step_due(self) -> bool:
        return self.text_lines >= self._reserved - 1  # at least one empty row ahead

    def settle(self) -> None:
        """The reply ended: the widget back to the height of its text."""
        self._step_owed = None
        if self._reserved:
            self._reserved = 0
            self.refresh(layout=True)

    def _live_source(self) -> str:
        return self._text[self._splitter.stable_end :]

    def _next_step(self, now: float) -> int:
        """Rows of room for the next `STEP_EVERY_S` at the rate the text has been growing,
        so a fast stream lays out every two seconds or so and a slow one keeps a line or
        two of room; never more than half the screen."""
        lines = self.text_lines
        if self._last_step is not None:
            then, lines_then = self._last_step
            rate = (lines - lines_then) / max(now - then, 1e-3)
            self._step_lines = math.ceil(rate * STEP_EVERY_S)
        self._last_step = (now, lines)
        rows = self.screen.size.height if self.is_attached else 0
        most = max(RESERVE_MIN, rows // RESERVE_SHARE)
        self._step_lines = max(RESERVE_MIN, min(self._step_lines, most))
        return self._step_lines

    # -- rendering -------------------------------------------------------------------------
    def _render_markdown(self, markdown: str, width: int) -> list[list[Segment]]:
        if not markdown.strip() or width < 1:
            return []
        console = self.app.console
        options = console.options.update(width=width, height=None)
        return console.render_lines(RichMarkdown(markdown), options, pad=False)

    def _render_live(self, width: int) -> list[list[Segment]]:
        """The live block's lines. An open code fence at the margin is highlighted in
        chunks of whole lines, each once, plus the lines after the last whole chunk;
        anything else (and the fence, once closed) as rich's Markdown draws it."""
        source = self._live_source()
        fence = self._splitter.open_fence
        first, _, code = source.partition("\n")
        if fence is None or not first.startswith(fence) or width < 3:
            return self._render_markdown(source, width)
        lexer = first[len(fence) :].strip().partition(" ")[0] or "text"
        lines = code.split("\n")
        done = len(self._code_chunks) * CODE_CHUNK
        while len(lines) - 1 - done >= CODE_CHUNK:  # the last item is not a whole line
            chunk = lines[done : done + CODE_CHUNK]
            self._code_chunks.append(self._highlight(chunk, lexer, width, top=not done))
            done += CODE_CHUNK
        tail = self._highlight(lines[done:], lexer, width, top=not done, bottom=True)
        return [line for chunk in self._code_chunks for line in chunk] + tail

    def _highlight(
        self, lines: list[str], lexer: str, width: int, *, top: bool, bottom: bool = False
    ) -> list[list[Segment]]:
        # As rich's Markdown draws a code block (Syntax, padding 1), cut into pieces.
        code = "\n".join(lines).rstrip() if bottom else "\n".join(lines)
        syntax = Syntax(
            code,
            lexer,
            theme=CODE_THEME,
            word_wrap=True,
            padding=(int(top), 1, int(bottom), 1),
        )
        console = self.app.console
        options = console.options.update(width=width, height=None)
        return console.render_lines(syntax, options, pad=False)

    def _separated(self, lines: list[list[Segment]]) -> list[list[Segment]]:
        """A block's lines as they follow the blocks before it: rich's Markdown puts one
        blank line between top-level blocks, and starts some (lists, quotes) with one of
        their own when drawn alone."""
        if not self._stable:
            return lines
        start = 0
        while start < len(lines) and not Segment.get_line_length(lines[start]):
            start += 1
        return [[], *lines[start:]] if start < len(lines) else []

    def _rerender(self, width: int) -> None:
        self._width = width
        self._stable = []
        for block in self._blocks:
            self._stable += self._separated(self._render_markdown(block, width))
        self._code_chunks = []
        self._live = self._separated(self._render_live(width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._width:
            self._rerender(width)
        if self._step_owed is not None and width > 0:
            if self._step_due():
                self._reserved = self.text_lines + self._next_step(self._step_owed)
            self._step_owed = None
        return max(self.text_lines, self._reserved)

    def render_lines(self, crop: Region) -> list[Strip]:
        # The style once per repaint: `rich_style` walks the ancestors' backgrounds.
        self._line_style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        if width < 1:
            return Strip.blank(0)
        if width != self._width:
            self._rerender(width)
        stable = len(self._stable)
        if y < stable:
            line = self._stable[y]
        elif y - stable < len(self._live):
            line = self._live[y - stable]
        else:
            return Strip.blank(width, self._line_style)
        return Strip(line).adjust_cell_length(width).apply_style(self._line_style)
