"""Where tapes go by default: the user's data folder, one file per session."""

from __future__ import annotations

import os
import time
from pathlib import Path

import platformdirs

SUFFIX = ".jsonl"


def tapes_dir() -> Path:
    """`<user data dir>/kvscope/tapes`; KVSCOPE_TAPE_DIR overrides it (tests, CI)."""
    override = os.environ.get("KVSCOPE_TAPE_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir("kvscope")) / "tapes"


def default_tape_path(when: float | None = None) -> Path:
    """A new tape's path, named by the local time it starts; never an existing file."""
    folder = tapes_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    path = folder / f"{stamp}{SUFFIX}"
    n = 2
    while path.exists():
        path = folder / f"{stamp}-{n}{SUFFIX}"
        n += 1
    return path


def latest_tape() -> Path | None:
    """The most recently written tape in the default folder (for `--resume`), if any."""
    folder = tapes_dir()
    if not folder.is_dir():
        return None
    tapes = [p for p in folder.glob(f"*{SUFFIX}") if p.is_file()]
    return max(tapes, key=lambda p: p.stat().st_mtime, default=None)
