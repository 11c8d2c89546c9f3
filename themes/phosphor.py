"""Green-phosphor terminal: nearly monochrome, for demos that want the old-CRT look.

Hues stay distinct enough (green, amber, cyan, red) for the block map and latency colours.
"""

from __future__ import annotations

from textual.theme import Theme

THEME = Theme(
    name="phosphor",
    primary="#33FF66",
    secondary="#22B8A0",
    accent="#FFB000",
    warning="#FFD24D",
    error="#FF5F4F",
    success="#7CFF9B",
    foreground="#B8FFC8",
    background="#050B06",
    surface="#0B160D",
    panel="#123018",
    dark=True,
)
