"""LiveMarkdown: Markdown that grows at its end without laying out the screen per append.

Textual's `Markdown.append` re-parses only the last block, but that block's `update()`
asks for a layout of the whole screen every time. The layout moves the transcript (the
reply grew a line), and a moved transcript is repainted from top to bottom: at a fast
stream that is most of every frame (`benchmarks/ui_lag.py --profile`).

Here the last block keeps some empty lines below its text while it streams (its
min-height). Text that still fits the block's height repaints the block alone; only a
step of the reserve, or a new block, lays the screen out. The step follows the stream: it
doubles while steps come less than a second apart and halves when they are rare, so a
fast stream scrolls about once a second and a slow one keeps only a line or two of room.
A new block takes over the room the one before it kept, so the reply keeps its height.
`settle()` gives the room back when the reply ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual.widgets import Markdown

# Not re-exported by textual.widgets.markdown; the pinned Textual has it here, and
# tests/test_tui_repaint.py fails loudly if a new one moves it.
from textual.widgets._markdown import MarkdownBlock, MarkdownParagraph

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from textual.content import Content
    from textual.widget import AwaitMount, Widget

RESERVE_START = 4
"""Empty lines kept under a streaming block at first."""
RESERVE_MIN = 2
RESERVE_SHARE = 3
"""A step is at most a third of the screen's rows, so the text stays in view."""
STEP_FAST_S = 1.0
"""Steps closer together than this: the next one is twice as big..."""
STEP_SLOW_S = 3.0
"""...and further apart than this: half as big."""
MIN_SPARE = 2
"""A new block given fewer empty lines than this gets a new step of the reserve."""


def _reserved(block: MarkdownBlock) -> int:
    floor = block.styles.min_height
    return int(floor.value) if floor is not None and floor.is_cells else 0


class LiveParagraph(MarkdownParagraph):
    """A paragraph whose new text lays out the screen only when its height changes."""

    def set_content(self, content: Content) -> None:
        self._content = content
        self.update(content, layout=self._height_changes(content))

    def _height_changes(self, content: Content) -> bool:
        if not self.is_mounted:
            # A block the parser just built: mounting it lays it out. Asking for a layout
            # now would cost a second one, in the frame after the mount.
            return False
        width, height = self.content_size
        if not width:
            return True
        reserved = _reserved(self)
        # As Widget.get_content_height measures it (styles serve as the rules map there too).
        lines: int = content.get_height(self.styles, width)  # type: ignore[arg-type]
        return max(reserved, lines) != height


class LiveMarkdown(Markdown):
    """Markdown for a reply that is still streaming (see the module's docstring)."""

    # Markdown declares BLOCKS as an instance attribute: a ClassVar here would not type-check.
    BLOCKS: dict[str, type[MarkdownBlock]] = {  # noqa: RUF012
        **Markdown.BLOCKS,
        "paragraph_open": LiveParagraph,
    }

    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._step_lines = RESERVE_START
        self._last_step: float | None = None

    async def append_live(self, markdown: str) -> None:
        """Append `markdown`, then keep the reserve under the (new) last block."""
        await self.append(markdown)
        self._reserve()

    def mount_all(
        self,
        widgets: Iterable[Widget],
        *,
        before: int | str | Widget | None = None,
        after: int | str | Widget | None = None,
    ) -> AwaitMount:
        # Markdown.append mounts new blocks here, inside one batch: handing the room over
        # now puts the mount and the new heights in one layout instead of two.
        new = list(widgets)
        blocks = [widget for widget in new if isinstance(widget, MarkdownBlock)]
        if blocks:
            self._hand_over(blocks[-1])
        return super().mount_all(new, before=before, after=after)

    def _hand_over(self, new_last: MarkdownBlock) -> None:
        """The room kept under the old blocks goes to `new_last`, so the reply keeps its
        height and the transcript does not move (a moved transcript is repainted whole);
        with little room left, a new step."""
        spare = 0
        for block in self.query_children(MarkdownBlock):
            if block.styles.min_height is not None:
                width = block.content_size.width
                if width:
                    spare += max(0, _reserved(block) - self._lines(block, width))
                block.styles.min_height = None
        new_last.styles.min_height = spare if spare >= MIN_SPARE else spare + self._next_step()

    def _reserve(self) -> None:
        blocks = [child for child in self.children if isinstance(child, MarkdownBlock)]
        if not blocks:
            return
        last = blocks[-1]
        reserved = _reserved(last)
        width = last.content_size.width
        if not width:
            if not reserved:  # the first block: not handed any room yet
                last.styles.min_height = self._next_step()
            return
        needed = self._lines(last, width)
        if needed >= reserved - 1:  # keep at least one empty line ahead of the text
            last.styles.min_height = needed + self._next_step()

    def _next_step(self) -> int:
        now = self.clock()
        if self._last_step is not None:
            gap = now - self._last_step
            if gap < STEP_FAST_S:
                self._step_lines *= 2
            elif gap > STEP_SLOW_S:
                self._step_lines //= 2
        self._last_step = now
        rows = self.screen.size.height if self.is_attached else 0
        most = max(RESERVE_MIN, rows // RESERVE_SHARE)
        self._step_lines = max(RESERVE_MIN, min(self._step_lines, most))
        return self._step_lines

    def _lines(self, block: MarkdownBlock, width: int) -> int:
        return block.get_content_height(self.size, self.size, width)

    def settle(self) -> None:
        """The reply ended: every block back to the height of its text."""
        for block in self.query_children(MarkdownBlock):
            if block.styles.min_height is not None:
                block.styles.min_height = None
