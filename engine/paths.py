"""Where kvscope keeps what it makes (the converted model, calibration, engine logs), and
how it writes there: privately.

Looking a path up never writes anything: a read-only cache that already holds a ready
model must still work. Only code that writes creates folders, through
`ensure_cache_subdir`, which says in words which folder failed and how to move it.

Tapes hold every prompt and reply, and the log and settings say what a user ran: on a
shared GPU box none of it is for the other users. So every folder kvscope creates is
0700 and every file it writes is 0600, whatever the umask (`private_dir`,
`open_private`, `write_private`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import TextIO

import platformdirs

from engine.errors import CacheDirUnwritable

CACHE_ENV = "KVSCOPE_CACHE_DIR"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def cache_dir() -> Path:
    """The user's cache folder for kvscope; KVSCOPE_CACHE_DIR overrides it (tests, CI).

    Not created here: see `ensure_cache_subdir`.
    """
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("kvscope"))


def missing_home() -> Path | None:
    """$HOME when it is set but is no folder (`HOME=/nonexistent`, a service account):
    kvscope never creates it, since a home made by a program belongs to no one's plan."""
    home = os.environ.get("HOME")
    if not home:
        return None
    path = Path(home)
    return None if path.is_dir() else path


def private_dir(folder: Path) -> Path:
    """Create `folder` and any missing parent, each 0700 whatever the umask.

    A folder that is already there is left as it is: it may be the user's own (the
    working folder, /tmp), and its mode is theirs to choose. A missing $HOME is never
    created (FileNotFoundError, in words). Raises OSError.
    """
    missing: list[Path] = []
    here = folder
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    home = missing_home()
    if home is not None and home in missing:
        raise FileNotFoundError(
            errno.ENOENT, f"HOME ({home}) does not exist, and kvscope does not create it"
        )
    for path in reversed(missing):
        try:
            path.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        # mkdir's mode is masked by the umask; chmod is not.
        os.chmod(path, PRIVATE_DIR_MODE)
    return folder


def ensure_cache_subdir(folder: Path) -> Path:
    """Create `folder` (inside the cache) if needed, or say plainly why it cannot be."""
    try:
        private_dir(folder)
    except OSError as exc:
        raise CacheDirUnwritable(str(folder), exc.strerror or type(exc).__name__) from None
    return folder


def open_private(path: str | os.PathLike[str], flags: int, *, dir_fd: int | None = None) -> int:
    """`os.open` of a file kvscope writes: created 0600, and an existing regular file made
    0600 too, since it is about to hold prompts (a tape or log left 0644 by an older
    kvscope); a device or FIFO is opened as it is. Never follows a symlink at `path`."""
    fifo = _is_fifo(path, dir_fd)
    # A FIFO with no reader would block the open for good: ENXIO instead (said by the caller).
    extra = os.O_NONBLOCK if fifo else 0
    fd = os.open(path, flags | extra | _NOFOLLOW | _CLOEXEC, PRIVATE_FILE_MODE, dir_fd=dir_fd)
    try:
        if fifo:
            os.set_blocking(fd, True)
        # Only a regular file is ours to make private: a device (/dev/null) or a FIFO is
        # shared, and chmodding it would take it away from every other user.
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_fifo(path: str | os.PathLike[str], dir_fd: int | None) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def is_special_file(path: str | os.PathLike[str]) -> bool:
    """An existing path that is neither a regular file nor a folder: a device (/dev/null,
    /dev/stdout's terminal) or a FIFO. Output there is written in place, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def write_in_place(path: str | os.PathLike[str], raw: bytes) -> None:
    """Write `raw` into a device or FIFO as it is: no temporary file, no rename, no chmod.
    A FIFO nobody reads raises OSError(ENXIO) at once instead of blocking. Raises OSError."""
    fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    fd = os.open(path, os.O_WRONLY | _CLOEXEC | (os.O_NONBLOCK if fifo else 0))
    try:
        if fifo:
            os.set_blocking(fd, True)
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def output_problem(path: str | os.PathLike[str], exc: OSError) -> str:
    """Why an output could not be written, in words: a FIFO nobody reads is not 'No such
    device or address'."""
    if exc.errno == errno.ENXIO and _is_fifo(path, None):
        return "it is a FIFO that no process is reading"
    return exc.strerror or str(exc)


def write_private(path: Path, data: str | bytes) -> Path:
    """Write `path` whole, atomically (a 0600 temporary file beside it, renamed over it),
    so a reader never sees half a file; a device or FIFO there is written in place, since
    renaming over /dev/null would replace it. Raises OSError."""
    raw = data.encode() if isinstance(data, str) else data
    if is_special_file(path):
        write_in_place(path, raw)
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), PRIVATE_FILE_MODE)
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def engine_log_path() -> Path:
    """Where vLLM's log goes; `route_vllm_logs` falls back elsewhere if it cannot write."""
    return cache_dir() / "engine.log"


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def open_private_log(path: Path) -> TextIO:
    """The engine log at `path`, for appending: its folder made if need be (0700), the
    file 0600, a symlink in its place refused. Raises OSError."""
    private_dir(path.parent)
    return os.fdopen(open_private(path, _APPEND), "a", encoding="utf-8")


def fallback_log_dir() -> Path:
    """`$TMPDIR/kvscope-UID`: where the log goes when the cache folder cannot take it."""
    return Path(tempfile.gettempdir()) / f"kvscope-{os.getuid()}"


class UnsafeFolder(OSError):
    """A folder kvscope will not write in, in words (`strerror`)."""


def open_fallback_log() -> tuple[Path, TextIO]:
    """The engine log in `fallback_log_dir()`, opened only if that is a real folder
    (not a symlink), owned by this user, mode 0700: in a temp folder every user can
    write, anything else may have been planted to make kvscope write into another
    user's file. The folder is opened without following links, and the log inside it
    through that handle, so nothing can be swapped in between. Raises OSError (an
    `UnsafeFolder` says why in words)."""
    folder = fallback_log_dir()
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, PRIVATE_DIR_MODE)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFolder(
                exc.errno, f"{folder} is a symlink or not a folder, so it is not used"
            ) from None
        raise
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.getuid():
            raise UnsafeFolder(
                errno.EPERM,
                f"{folder} belongs to user {st.st_uid}, not to you, so it is not used",
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode != PRIVATE_DIR_MODE:
            raise UnsafeFolder(
                errno.EPERM, f"{folder} has mode {mode:04o}, not 0700, so it is not used"
            )
        fd = open_private("engine.log", _APPEND, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return folder / "engine.log", os.fdopen(fd, "a", encoding="utf-8")
