"""Saved sweeps read back from a file, to compare a live sweep against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.sweep_result import SweepResult, required_key
from engine.errors import KvscopeError

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class SavedSweep:
    """One engine config's sweep, read back from a file."""

    label: str
    """"" for a plain sweep file; "A" or "B" for a `bench --compare` file."""
    result: SweepResult
    flags: str | None = None
    """The config's engine flags, from a compare file ("" for the defaults)."""


class SweepFileError(KvscopeError):
    """A saved sweep that cannot be read back: the file, and why in plain words."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def plain(self) -> str:
        return f"Cannot load {self.path}: {self.why}."


def saved_sweeps_from_json(text: str) -> list[SavedSweep]:
    """The sweeps in what `bench --json` (or the sweep screen's export) wrote: one
    SweepResult, or `bench --compare`'s {"compare": {"A": {"flags": ..., ...}, "B": ...}}.

    Raises ValueError in words: not JSON, or the key that is missing.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"it is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    try:
        if isinstance(data, dict) and "compare" in data:
            configs = required_key(data, "compare", "the file", dict)
            if not configs:
                raise ValueError('the file\'s "compare" holds no config')
            saved = []
            for label, body in configs.items():
                where = f"config {label}"
                result = SweepResult.from_dict(body, where)
                flags = body.get("flags")
                saved.append(
                    SavedSweep(str(label), result, flags if isinstance(flags, str) else "")
                )
            return saved
        return [SavedSweep("", SweepResult.from_dict(data))]
    except ValueError as exc:
        raise ValueError(f"it is not a sweep result: {exc}") from None


def load_saved_sweeps(path: Path) -> list[SavedSweep]:
    """Read a saved sweep (see `saved_sweeps_from_json`) to compare against; a file
    without one measured point has nothing to compare, and says so.

    Raises SweepFileError, whose `plain()` is one sentence naming the file.
    """
    name = str(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise SweepFileError(name, "there is no such file") from None
    except IsADirectoryError:
        raise SweepFileError(name, "it is a folder, not a file") from None
    except UnicodeDecodeError:
        raise SweepFileError(name, "it is not JSON (not even text)") from None
    except OSError as exc:
        raise SweepFileError(name, exc.strerror or str(exc)) from None
    try:
        saved = saved_sweeps_from_json(text)
    except ValueError as exc:
        raise SweepFileError(name, str(exc)) from None
    points = [p for s in saved for p in s.result.points]
    if not any(p.ok and p.metrics is not None for p in points):
        if not points:
            why = "it holds no measured point (its list of points is empty)"
        elif len(points) == 1:
            why = "it holds no measured point (its one prompt length failed)"
        else:
            why = f"it holds no measured point (all {len(points)} prompt lengths failed)"
        raise SweepFileError(name, why)
    return saved
