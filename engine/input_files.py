"""Opening a file the user names (a tape, a saved sweep): a regular file, or a refusal in words.

A FIFO blocks its reader until a writer comes, and opening one blocks too; /dev/zero and
other devices never end. So the path is looked at before it is opened, opened without
blocking, and looked at again through the handle (it may have been swapped meanwhile).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from pathlib import Path


class NotAFile(OSError):
    """`path` is not a regular file that can be read: `why` says what it is, in words."""

    def __init__(self, why: str, *, missing: bool = False, folder: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.missing = missing
        self.folder = folder


def _what(mode: int) -> NotAFile | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return NotAFile("it is a folder", folder=True)
    if stat.S_ISFIFO(mode):
        return NotAFile("it is a pipe (FIFO), which could keep kvscope waiting forever")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return NotAFile("it is a device, not a file, and may never end")
    return NotAFile("it is not a regular file")


def open_regular_file(path: Path) -> tuple[BinaryIO, int]:
    """`path` opened for reading, and its size. Raises NotAFile."""
    try:
        refused = _what(os.stat(path).st_mode)
    except FileNotFoundError:
        raise NotAFile("there is no such file", missing=True) from None
    except OSError as exc:
        raise NotAFile(f"it cannot be opened ({exc.strerror or exc})") from None
    if refused is not None:
        raise refused
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotAFile("there is no such file", missing=True) from None
    except OSError as exc:
        raise NotAFile(f"it cannot be opened ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    refused = _what(st.st_mode)
    if refused is not None:
        os.close(fd)
        raise refused
    return os.fdopen(fd, "rb"), st.st_size
