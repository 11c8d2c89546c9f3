"""kvscope's widgets, one to a module, each styled by the .tcss file next to it."""

from __future__ import annotations

from pathlib import Path

STYLESHEETS: tuple[Path, ...] = tuple(sorted(Path(__file__).parent.glob("*.tcss")))
"""Every widget stylesheet; an app (or a test's tiny app) loads them all."""
