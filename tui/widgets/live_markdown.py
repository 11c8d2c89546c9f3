"""LiveMarkdown: Markdown that grows at its end without laying out the screen per append.

Textual's `Markdown.append` re-parses only the last block, but that block's `update()`
asks for a layout of the whole screen every time. The layout moves the transcript (the
reply grew a line), and a moved transcript is repainted from top to bottom: at a fast
stream that is most of every frame (`benchmarks/ui_lag.py --profile`).

Here the last block keeps some empty lines below its text while it streams (its
min-height, grown in steps of `RESERVE_LINES`). Text that still fits the block's height
repaints the block alone; only a step of the reserve, or a new block, lays the screen out.
`settle()` gives the reserve back when the reply ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Markdown

# Not re-exported by textual.widgets.markdown; the pinned Textual has it here, and
# tests/test_tui_widgets.py fails loudly if a new one moves it.
from textual.widgets._markdown import MarkdownBlock, MarkdownParagraph

if TYPE_CHECKING:
    from textual.content import Content

RESERVE_LINES = 8
"""Most empty lines kept under a streaming block: one layout per this many lines of text."""
RESERVE_SHARE = 6
"""...and at most a sixth of the screen's rows, so a small terminal still shows the text."""


MIN_SPARE = 3
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
        width, height = self.content_size
        if not width or not self.is_mounted:
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

    async def append_live(self, markdown: str) -> None:
        """Append `markdown`, then keep the reserve under the (new) last block."""
        await self.append(markdown)
        self._reserve()

    def _reserve(self) -> None:
        blocks = [child for child in self.children if isinstance(child, MarkdownBlock)]
        if not blocks:
            return
        spare = 0
        for block in blocks[:-1]:
            if block.styles.min_height is not None:
                width = block.content_size.width
                if width:
                    spare += max(0, _reserved(block) - self._lines(block, width))
                block.styles.min_height = None
        last = blocks[-1]
        reserved = _reserved(last)
        width = last.content_size.width
        if not width:
            # Just mounted, not laid out yet. It takes over the room the block before it
            # kept, so the reply keeps its height and the transcript does not move (a
            # moved transcript is repainted whole); with little room left, a new step.
            if not reserved:
                last.styles.min_height = spare if spare >= MIN_SPARE else spare + self._step()
            return
        needed = self._lines(last, width)
        if needed >= reserved - 1:  # keep at least one empty line ahead of the text
            last.styles.min_height = needed + self._step()

    def _step(self) -> int:
        rows = self.screen.size.height if self.is_attached else 0
        return max(2, min(RESERVE_LINES, rows // RESERVE_SHARE))

    def _lines(self, block: MarkdownBlock, width: int) -> int:
        return block.get_content_height(self.size, self.size, width)

    def settle(self) -> None:
        """The reply ended: every block back to the height of its text."""
        for block in self.query_children(MarkdownBlock):
            if block.styles.min_height is not None:
                block.styles.min_height = None
