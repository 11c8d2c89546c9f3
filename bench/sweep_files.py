"""Saved sweeps read back from a file, to compare a live sweep against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.sweep_result import SweepResult, required_key
from engine.errors import KvscopeError
from engine.input_files import NotAFile, open_regular_file
from engine.sizes import MIB

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


MAX_FILE_BYTES = 64 * MIB
"""A saved sweep with every request's timings is a few MB; past this, it is not one."""
MAX_NUMBER = 1e15
"""Past any real latency (ms), length or rate: the charts and ratios stay finite."""


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, and no figure of a sweep is one.
    raise ValueError(f"it holds {name}, which is not a number JSON has (nor a measurement)")


def _check_numbers(data: Any) -> None:
    """Every number in the file is within ±MAX_NUMBER (1e308 overflows the charts)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif (
            isinstance(item, int | float)
            and not isinstance(item, bool)
            and not -MAX_NUMBER <= item <= MAX_NUMBER
        ):
            shown = str(item) if len(str(item)) <= 24 else str(item)[:21] + "..."
            raise ValueError(
                f"it holds the number {shown}, past the ±{MAX_NUMBER:g} a sweep's figures "
                "stay within"
            )


def saved_sweeps_from_json(text: str) -> list[SavedSweep]:
    """The sweeps in what `bench --json` (or the sweep screen's export) wrote: one
    SweepResult, or `bench --compare`'s {"compare": {"A": {"flags": ..., ...}, "B": ...}}.

    Raises ValueError in words: not JSON, or the key that is missing.
    """
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"it is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ValueError("it is not a sweep result: its JSON is nested too deep") from None
    _check_numbers(data)
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
        f, size = open_regular_file(path)  # never a FIFO or a device: they may not end
    except NotAFile as exc:
        raise SweepFileError(name, exc.why + (", not a file" if exc.folder else "")) from None
    try:
        with f:
            if size > MAX_FILE_BYTES:
                raise SweepFileError(
                    name,
                    f"it is {size:,} bytes, more than a saved sweep's {MAX_FILE_BYTES:,}",
                )
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SweepFileError(name, exc.strerror or str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:  # it grew while it was read
        raise SweepFileError(name, f"it is more than a saved sweep's {MAX_FILE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SweepFileError(name, "it is not JSON (not even text)") from None
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
