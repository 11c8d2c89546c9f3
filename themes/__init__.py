"""Textual themes for kvscope, one per module; the app registers them at mount."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.theme import Theme


def all_themes() -> tuple[Theme, ...]:
    """Every kvscope theme, the default first."""
    from themes import kvscope_dark, kvscope_light, phosphor

    return (kvscope_dark.THEME, kvscope_light.THEME, phosphor.THEME)
