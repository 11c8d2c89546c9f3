"""FieldLine: "a │ b │ c" that wraps between fields, never inside one.

A reply's footer is a row of fields ("TTFT 93 ms", "ITL p50 37.1 ms · p99 55.0 ms", ...).
Wrapped as plain text it broke inside a field ("ITL p50 37.1" / "ms"), which reads as two
different numbers. Each field here stays whole: a line break only comes at a separator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

if TYPE_CHECKING:
    from textual.geometry import Size

SEPARATOR = " │ "


def pack(fields: tuple[str, ...], width: int, separator: str = SEPARATOR) -> list[str]:
    """The lines `fields` take at `width` cells, breaking only between fields.

    A field wider than the whole line gets a line of its own (and is folded by the
    terminal); no field is ever split to fill the end of a line.
    """
    lines: list[str] = []
    current = ""
    for field in fields:
        if not current:
            current = field
        elif cell_len(current) + cell_len(separator) + cell_len(field) <= width:
            current += separator + field
        else:
            lines.append(current)
            current = field
    if current or not lines:
        lines.append(current)
    return lines


class FieldLine(Widget):
    """A line of fields, wrapped between fields to the widget's width."""

    DEFAULT_CSS = """
    FieldLine {
        height: auto;
        width: 1fr;
    }
    """

    def __init__(
        self,
        fields: tuple[str, ...] = (),
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._fields = fields

    @property
    def fields(self) -> tuple[str, ...]:
        return self._fields

    def set_fields(self, fields: tuple[str, ...], *, layout: bool = True) -> None:
        """Show `fields`; `layout=False` when the line count cannot have changed."""
        if fields == self._fields:
            return
        old = len(pack(self._fields, max(1, self.content_size.width)))
        self._fields = fields
        new = len(pack(fields, max(1, self.content_size.width)))
        self.refresh(layout=layout or old != new)

    @property
    def plain(self) -> str:
        """The fields on one line (for tests and the transcript's text)."""
        return SEPARATOR.join(self._fields)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if not self._fields:
            return 0
        return len(pack(self._fields, max(1, width)))

    def render(self) -> Text:
        width = max(1, self.content_size.width)
        return Text("\n".join(pack(self._fields, width)), end="")
