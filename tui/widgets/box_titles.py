"""Border titles that repaint one row, not the whole box."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Region

if TYPE_CHECKING:
    from textual.content import Content
    from textual.widget import Widget


def _same(a: Content, b: Content | None) -> bool:
    # Content's own == compares the words only: a colour change must count too.
    return b is not None and a.plain == b.plain and a.spans == b.spans


def retitle(box: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """Set `box`'s border title and subtitle (None leaves one as it is).

    Textual's `border_title` setter repaints the whole box, and with it every widget
    inside, even when the words did not change. A box title that moves with every engine
    step (KV usage "now 34%") then cost a repaint of the box's plot at 10 Hz, and that
    repaint's rectangle spans the panel. Here an unchanged title costs nothing and a
    changed one repaints only its border row: the styles cache reads `_border_title`
    afresh for every row it renders, so the row is all that needs drawing again.
    """
    width, height = box.outer_size
    for text, attribute, row in (
        (title, "_border_title", 0),
        (subtitle, "_border_subtitle", height - 1),
    ):
        if text is None:
            continue
        # The same conversion the setter makes (tested against it).
        new = box.render_str(text).expand_tabs(4).split()[0]
        if _same(new, getattr(box, attribute)):
            continue
        setattr(box, attribute, new)
        if box.is_mounted and width and height:
            # refresh() takes regions relative to the content, inside the border.
            x, y = box.content_offset
            box.refresh(Region(-x, max(0, row) - y, width, 1))
        else:
            box.refresh()
