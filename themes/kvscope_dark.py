"""kvscope's default: a calm dark theme where the request colours of the block map stay
apart and the latency colours (success / warning / error) read at a glance."""

from __future__ import annotations

from textual.theme import Theme

THEME = Theme(
    name="kvscope-dark",
    primary="#5AA9E6",
    secondary="#9B7FE0",
    accent="#F2A541",
    warning="#F2C14E",
    error="#E5575B",
    success="#5CC68D",
    foreground="#D8DEE9",
    background="#161A22",
    surface="#1E232D",
    panel="#272E3A",
    dark=True,
)
