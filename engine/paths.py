"""Where kvscope keeps what it makes: the converted model, calibration, engine logs.

Looking a path up never writes anything: a read-only cache that already holds a ready
model must still work. Only code that writes creates folders, through
`ensure_cache_subdir`, which says in words which folder failed and how to move it.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from engine.errors import CacheDirUnwritable

CACHE_ENV = "KVSCOPE_CACHE_DIR"


def cache_dir() -> Path:
    """The user's cache folder for kvscope; KVSCOPE_CACHE_DIR overrides it (tests, CI).

    Not created here: see `ensure_cache_subdir`.
    """
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("kvscope"))


def ensure_cache_subdir(folder: Path) -> Path:
    """Create `folder` (inside the cache) if needed, or say plainly why it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheDirUnwritable(str(folder), exc.strerror or type(exc).__name__) from None
    return folder


def engine_log_path() -> Path:
    """Where vLLM's log goes; `route_vllm_logs` falls back elsewhere if it cannot write."""
    return cache_dir() / "engine.log"
