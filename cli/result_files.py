"""`bench --json FILE` and `--csv FILE`: the sweep's results, kept on disk as it runs."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.sweep_result import SweepResult
from engine.errors import BadOption
from engine.paths import is_special_file, output_problem, write_in_place

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence


class ResultFile:
    """One --json or --csv output, written again after every point, so a sweep that is
    stopped or crashes keeps what it measured.

    Each write goes to a temporary file beside the target and is renamed over it, so a
    reader never sees half a file. If the target cannot be written after all (a full
    disk, a folder removed mid-sweep), the results go to the temp folder instead, and
    `problem()` says where.

    A device or FIFO (`--json /dev/stdout`, `/dev/null`, a pipe someone reads) is never
    renamed over: it gets the final results once, written in place, by `finish()`.
    """

    def __init__(self, option: str, path: str, render: Callable[[Any], str]) -> None:
        # `render` takes what `write` is given: a SweepResult, or a load run's LoadResult.
        self.option = option
        self.path = Path(path)
        self.render = render
        self.written_to: Path | None = None
        self.error: str | None = None
        self.special = is_special_file(self.path)
        self._pending: str | None = None  # a special file's latest text, for finish()

    def check(self) -> None:
        """Before the engine starts: can a file be created where the user asked?"""
        if self.path.is_dir():
            raise BadOption(self.option, f"{self.path} is a folder, not a file")
        if self.special:
            if not os.access(self.path, os.W_OK):
                raise BadOption(
                    self.option, f"{self.path} is a device or FIFO kvscope cannot write"
                )
            return
        folder = self.path.parent
        if not folder.is_dir():
            raise BadOption(self.option, f"the folder {folder} does not exist")
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{self.path.name}.", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise BadOption(
                self.option, f"cannot write in {folder} ({exc.strerror or exc})"
            ) from None

    def write(self, result: Any) -> None:
        """Never raises: losing the file must not lose the sweep."""
        text = self.render(result)
        if self.special:
            # Written once, at the end: each point's rewrite would reach a device or a
            # pipe's reader as one more copy of the whole file.
            self._pending = text
            return
        if self.error is None:
            try:
                _replace_atomically(self.path, text)
                self.written_to = self.path
                return
            except OSError as exc:
                self.error = exc.strerror or str(exc)
        self._keep_in_temp(text)

    def finish(self) -> None:
        """A device or FIFO gets its text now; a regular file has had it all along.
        Never raises: the fallback copy in the temp folder keeps the results."""
        text, self._pending = self._pending, None
        if text is None:
            return
        try:
            write_in_place(self.path, text.encode("utf-8"))
            self.written_to = self.path
            return
        except OSError as exc:
            self.error = output_problem(self.path, exc)
        self._keep_in_temp(text)

    def _keep_in_temp(self, text: str) -> None:
        """The target failed: the results go to the temp folder, or nowhere if that fails."""
        fallback = Path(tempfile.gettempdir()) / f"kvscope-bench-{os.getpid()}{self.path.suffix}"
        try:
            _replace_atomically(fallback, text)
            self.written_to = fallback
        except OSError:
            self.written_to = None

    def problem(self) -> str | None:
        if self.error is None:
            return None
        if self.written_to is None:
            return (
                f"could not write {self.path} ({self.error}), nor a copy in the temp "
                "folder: the table on stdout is all that is kept"
            )
        return f"could not write {self.path} ({self.error}); the results are in {self.written_to}"


def _replace_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def result_files(args: argparse.Namespace) -> list[ResultFile]:
    """The --json and --csv files asked for; the same file for both is refused, since
    the CSV would overwrite the JSON after every point (a link to it counts too)."""
    if args.json_path and args.csv_path and _same_file(args.json_path, args.csv_path):
        raise BadOption(
            "--csv",
            f"{args.csv_path} is the file --json writes too ({args.json_path}); give each "
            "its own path, or the CSV would overwrite the JSON",
        )
    files = []
    if args.json_path:
        files.append(ResultFile("--json", args.json_path, SweepResult.to_json))
    if args.csv_path:
        files.append(ResultFile("--csv", args.csv_path, SweepResult.to_csv))
    return files


def _same_file(a: str, b: str) -> bool:
    first, second = Path(a), Path(b)
    try:
        if first.exists() and second.exists():
            return first.samefile(second)
    except OSError:
        pass
    return first.resolve() == second.resolve()


def say_problems(files: Sequence[ResultFile]) -> None:
    from cli.launch import say

    for f in files:
        f.finish()  # every run ends here: a device or FIFO gets its results now
    for f in files:
        problem = f.problem()
        if problem:
            say(problem)
