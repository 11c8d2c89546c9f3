"""Where kvscope keeps what it makes: the converted model, calibration, engine logs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    """The user's cache folder for kvscope; KVSCOPE_CACHE_DIR overrides it (tests, CI)."""
    override = os.environ.get("KVSCOPE_CACHE_DIR")
    path = Path(override) if override else Path(platformdirs.user_cache_dir("kvscope"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def engine_log_path() -> Path:
    return cache_dir() / "engine.log"
