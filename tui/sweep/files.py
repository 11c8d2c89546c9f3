"""The sweep screen's files: where its exports go, writing one (F7 JSON, F8 CSV) as a private
file, and reading a saved sweep or load run back to compare with (F9).

No Textual here: each function returns the words the screen's status line shows, or raises
`FileTrouble` with them, and the screen shows them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import platformdirs

from bench.sweep_files import SweepFileError, load_saved
from engine.paths import is_special_file, output_problem, private_dir, write_private

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bench.sweep_files import SavedLoad, SavedSweep


class Exportable(Protocol):
    """What F7/F8 write: a prompt-length sweep's `SweepResult` or a `LoadResult`."""

    @property
    def points(self) -> Sequence[object]: ...

    def to_json(self) -> str: ...

    def to_csv(self) -> str: ...


class FileTrouble(Exception):
    """An export that could not be written, or a saved sweep that could not be read, in
    the one line of words the status line shows."""


def sweeps_folder() -> Path:
    """Where exports go unless told otherwise, written with `~` for the home folder: not
    the working folder, which in a clone of kvscope is the repository."""
    folder = Path(platformdirs.user_data_dir("kvscope")) / "sweeps"
    try:
        return Path("~") / folder.relative_to(Path.home())
    except ValueError:
        return folder


def follow_mode(typed: str, old_name: str, new_name: str) -> str | None:
    """The path field's new value when the mode changes: a path still at the other mode's
    default file name (`old_name`) takes this mode's (`new_name`); None for a name the user
    typed, which stays."""
    path = Path(typed)
    return str(path.with_name(new_name)) if path.name == old_name else None


def export(result: Exportable, kind: str, typed: str, default_name: str) -> str:
    """Write `result` as `kind` ("json" or "csv") where the path field says (`typed`; when
    empty, `default_name` in the working folder), as a private file in a private folder.

    Returns the status line's words. Raises FileTrouble."""
    text = result.to_json() if kind == "json" else result.to_csv()
    path = Path(typed.strip() or default_name).expanduser()
    if not is_special_file(path):
        # A device or FIFO is written as named: /dev/null is not /dev/null.json.
        path = path.with_suffix(f".{kind}")
    try:
        private_dir(path.parent)
        write_private(path, text)
    except OSError as exc:
        raise FileTrouble(f"Could not write {path}: {output_problem(path, exc)}") from exc
    return f"Wrote {len(result.points)} points to {path.resolve()}"


async def read_saved(path: Path) -> list[SavedSweep] | SavedLoad:
    """Whichever saved sweep `path` holds (see `bench.sweep_files.load_saved`), read off
    the event loop: a file of a few MB takes a moment to check.

    Raises FileTrouble, naming the file and why it is not one, whatever went wrong."""
    try:
        return await asyncio.to_thread(load_saved, path)
    except SweepFileError as exc:
        raise FileTrouble(exc.plain()) from exc
    except Exception as exc:
        # Not a kind of file the loader knows to refuse: still one line, not a crash.
        raise FileTrouble(f"Cannot load {path}: {type(exc).__name__}: {exc}") from exc
