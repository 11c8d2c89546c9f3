"""One layout per change of size, not two.

After every layout Textual sets each resized widget's `virtual_size`, a reactive that asks
for another layout of the screen in the next frame. That second layout changes nothing
for widgets whose content the first one already placed, but it costs a reflow and a
repaint of whatever it touches: under a fast stream, every growth of the reply was two
layouts of the transcript (`benchmarks/ui_lag.py`). Scrollbars do not depend on it: a
scrollable widget still updates them from the new size (`_scroll_update`), and their
appearing asks for its own layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widget import Widget

if TYPE_CHECKING:
    from textual.geometry import Size


class SingleLayout(Widget):
    """Mix in before a Textual widget class: its size changes cost one layout."""

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)
