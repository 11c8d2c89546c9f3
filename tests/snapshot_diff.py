"""A failed snapshot names the rows that changed, in the test's own output.

CI keeps no snapshot report, and a mismatch seen only there (another machine, another
load) cannot be re-made here: the rows that differ, as text, are what tells its cause.
"""

from __future__ import annotations

import difflib
import html
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')


def screen_rows(svg: str) -> list[str]:
    """The screen a Textual SVG screenshot shows, one string per row."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for match in _TEXT.finditer(svg):
        x, y, text = float(match[1]), float(match[2]), html.unescape(match[3])
        rows.setdefault(y, []).append((x, text))
    return ["".join(t for _, t in sorted(cells)).rstrip() for _, cells in sorted(rows.items())]


def rows_diff(expected_svg: str, actual_svg: str) -> str:
    """A unified diff of the two screens' rows ("" when their text is the same)."""
    lines = difflib.unified_diff(
        screen_rows(expected_svg),
        screen_rows(actual_svg),
        "expected screen",
        "this run's screen",
        lineterm="",
        n=1,
    )
    return "\n".join(lines)


def snapshot_file(test_file: Path, test_name: str) -> Path:
    """Where pytest-textual-snapshot keeps the accepted screenshot of `test_name`."""
    return test_file.parent / "__snapshots__" / test_file.stem / f"{test_name}.svg"
