"""A light theme for projectors and bright rooms: saturated, darker hues so that thin
plot lines and one-character KV blocks keep their contrast on a white background."""

from __future__ import annotations

from textual.theme import Theme

THEME = Theme(
    name="kvscope-light",
    primary="#1F5FAD",
    secondary="#6B3FA0",
    accent="#B35C00",
    warning="#A67C00",
    error="#C0262D",
    success="#1C7F45",
    foreground="#1E2430",
    background="#F7F7F4",
    surface="#EDEDE8",
    panel="#E0E1DA",
    dark=False,
)
