"""Saved sweeps read back from a file, to compare a live sweep against: a prompt-length
sweep (`SavedSweep`) or a load sweep (`SavedLoad`, what `kvscope bench --concurrency` and
the sweep screen's load mode write, marked `"kind": "load"`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, get_args

from bench.load_result import LoadConfig, LoadPoint, LoadResult, Profile, StepView
from bench.sweep_result import SweepResult, read_point_roofline, read_roofs, required_key
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
MAX_WORK = 1e21
"""The bound of a point's FLOPs, bytes and their rates (its "roofline" and the file's
"roofs"): a 70B model's 4k prompts run thrice count past 10^15 FLOPs, and a GPU's peak is
10^15 FLOP/s; still finite on a log axis (as the tapes' bound, engine/tape/values.py)."""
_WORK_KEYS = frozenset({"roofline", "roofs"})


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, and no figure of a sweep is one.
    raise ValueError(f"it holds {name}, which is not a number JSON has (nor a measurement)")


def _check_numbers(data: Any) -> None:
    """Every number in the file is within ±MAX_NUMBER (1e308 overflows the charts), or,
    under a "roofline" or "roofs" key, within ±MAX_WORK."""
    stack: list[tuple[Any, float]] = [(data, MAX_NUMBER)]
    while stack:
        item, bound = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, MAX_WORK if k in _WORK_KEYS else bound) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, bound) for v in item)
        elif (
            isinstance(item, int | float)
            and not isinstance(item, bool)
            and not -bound <= item <= bound
        ):
            shown = str(item) if len(str(item)) <= 24 else str(item)[:21] + "..."
            raise ValueError(
                f"it holds the number {shown}, past the ±{bound:g} a sweep's figures stay within"
            )


def saved_sweeps_from_json(text: str) -> list[SavedSweep]:
    """The sweeps in what `bench --json` (or the sweep screen's export) wrote: one
    SweepResult, or `bench --compare`'s {"compare": {"A": {"flags": ..., ...}, "B": ...}}.

    Raises ValueError in words: not JSON, or the key that is missing.
    """
    return _sweeps_from_data(_parse(text))


def _sweeps_from_data(data: Any) -> list[SavedSweep]:
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


def _read_text(path: Path) -> str:
    """The file's text, refused in words (SweepFileError) when it cannot be a saved sweep."""
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
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SweepFileError(name, "it is not JSON (not even text)") from None


def _check_measured(name: str, saved: list[SavedSweep]) -> list[SavedSweep]:
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


def load_saved_sweeps(path: Path) -> list[SavedSweep]:
    """Read a saved sweep (see `saved_sweeps_from_json`) to compare against; a file
    without one measured point has nothing to compare, and says so.

    Raises SweepFileError, whose `plain()` is one sentence naming the file.
    """
    text = _read_text(path)
    try:
        saved = saved_sweeps_from_json(text)
    except ValueError as exc:
        raise SweepFileError(str(path), str(exc)) from None
    return _check_measured(str(path), saved)


# -- load sweeps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedLoad:
    """A load run read back from a file: its config and points (as `LoadResult` wrote
    them, each request's timings included), to draw on the load plot."""

    result: LoadResult


_PROFILES = frozenset(get_args(Profile))
_POINT_FIELDS = {f.name: f for f in fields(LoadPoint)}
_STEP_FIELDS = {f.name: f for f in fields(StepView)}
_TEXT_FIELDS = frozenset({"error", "stopped_early"})
# With postponed annotations a field's type is its source text: "int", "int | None", ...
_WHOLE_FIELDS = frozenset(n for n, f in _POINT_FIELDS.items() if str(f.type).startswith("int"))
_WHOLE_STEPS = frozenset(n for n, f in _STEP_FIELDS.items() if str(f.type).startswith("int"))


def _number(value: Any, what: str, *, inf: bool = False) -> float:
    # A rate of inf is written as the string "inf", as it is typed (bench.load_result).
    if inf and value == "inf":
        return math.inf
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{what}: {value!r}, not a number")
    return float(value)


def _whole_or_none(value: Any, what: str) -> int | None:
    if value is None or value == "":
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: {value!r}, not a whole number")
    return value


def _load_config(data: Any) -> LoadConfig:
    cfg = required_key(data, "config", "the file", dict)
    where = 'the file\'s "config"'
    mode = required_key(cfg, "mode", where, str)
    if mode not in ("concurrency", "rate"):
        raise ValueError(f'{where} has "mode": {mode!r}, not "concurrency" or "rate"')
    levels = tuple(
        _number(v, f'{where} has a "levels" entry', inf=True)
        for v in required_key(cfg, "levels", where, list)
    )

    def whole(key: str) -> int:
        value = _whole_or_none(required_key(cfg, key, where), f'{where} has "{key}"')
        if value is None:
            raise ValueError(f'{where} has "{key}": null, not a whole number')
        return value

    return LoadConfig(
        mode=mode,  # checked just above
        levels=levels,
        prompt_len=whole("prompt_len"),
        output_len=whole("output_len"),
        num_prompts=_whole_or_none(cfg.get("num_prompts"), f'{where} has "num_prompts"'),
        warmup=_whole_or_none(cfg.get("warmup"), f'{where} has "warmup"') or 0,
        seed=_whole_or_none(cfg.get("seed"), f'{where} has "seed"') or 0,
    )


def _load_point(row: Any, n: int) -> LoadPoint:
    where = f"point {n} of the file"
    profile = required_key(row, "profile", where, str)
    if profile not in _PROFILES:
        raise ValueError(f'{where} has "profile": {profile!r}, not one of {sorted(_PROFILES)}')
    ok = required_key(row, "ok", where, bool)
    values: dict[str, Any] = {"profile": profile, "ok": ok}
    values["max_concurrency"] = _whole_or_none(
        required_key(row, "max_concurrency", where), f'{where} has "max_concurrency"'
    )
    rate = required_key(row, "request_rate", where)
    values["request_rate"] = (
        None if rate is None else _number(rate, f'{where} has "request_rate"', inf=True)
    )
    for name in _POINT_FIELDS:
        if name in values or name in ("requests", "steps", "notes", "roofline") or name not in row:
            continue
        value = row[name]
        if value is None or value == "":
            continue
        if name in _TEXT_FIELDS:
            values[name] = str(value)
        elif name in _WHOLE_FIELDS:
            values[name] = _whole_or_none(value, f'{where} has "{name}"')
        else:
            values[name] = _number(value, f'{where} has "{name}"')
    values.setdefault("burstiness", None)  # required, and null for a closed loop
    notes = row.get("notes")
    if isinstance(notes, str) and notes:
        values["notes"] = (notes,)  # the file joins them into one string
    if isinstance(row.get("steps_source"), str):
        step: dict[str, Any] = {"source": row["steps_source"]}
        for name in _STEP_FIELDS:
            value = row.get(f"steps_{name}")
            if name == "source" or value is None or value == "":
                continue
            what = f'{where} has "steps_{name}"'
            step[name] = (
                _whole_or_none(value, what) if name in _WHOLE_STEPS else _number(value, what)
            )
        try:
            values["steps"] = StepView(**step)
        except TypeError:
            raise ValueError(f"{where} has an incomplete steps_* view") from None
    requests = row.get("requests", [])
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        raise ValueError(f'{where} has "requests" that is not a list of objects')
    values["requests"] = tuple(requests)
    values["roofline"] = read_point_roofline(row, where)
    return LoadPoint(**values)


def saved_load_from_json(text: str) -> SavedLoad:
    """The load run that `LoadResult.to_json` wrote; a ValueError in words otherwise."""
    return _load_from_data(_parse(text))


def _load_from_data(data: Any) -> SavedLoad:
    try:
        config = _load_config(data)
        points = [
            _load_point(row, i)
            for i, row in enumerate(required_key(data, "points", "the file", list), 1)
        ]
    except ValueError as exc:
        raise ValueError(f"it is not a load sweep: {exc}") from None
    model = data.get("model")
    hardware = data.get("hardware")
    result = LoadResult(
        config,
        points,
        model=model if isinstance(model, dict) else None,
        hardware=hardware if isinstance(hardware, dict) else None,
        complete=data.get("complete") is not False,
    )
    try:
        result.roofs = read_roofs(data, "the file")
    except ValueError as exc:
        raise ValueError(f"it is not a load sweep: {exc}") from None
    return SavedLoad(result)


def _parse(text: str) -> Any:
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"it is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ValueError("it is not a sweep result: its JSON is nested too deep") from None
    _check_numbers(data)
    return data


def load_saved(path: Path) -> list[SavedSweep] | SavedLoad:
    """Whichever saved sweep `path` holds: prompt-length sweeps, or a load run (its JSON
    says `"kind": "load"`).

    Raises SweepFileError, whose `plain()` is one sentence naming the file.
    """
    name = str(path)
    try:
        data = _parse(_read_text(path))
        if not (isinstance(data, dict) and data.get("kind") == "load"):
            return _check_measured(name, _sweeps_from_data(data))
        saved = _load_from_data(data)
    except ValueError as exc:
        raise SweepFileError(name, str(exc)) from None
    measured = [p for p in saved.result.points if p.ok and p.output_throughput > 0]
    if not measured:
        count = len(saved.result.points)
        why = (
            "its list of points is empty"
            if not count
            else f"{'its one level' if count == 1 else f'all {count} levels'} failed"
        )
        raise SweepFileError(name, f"it holds no measured load point ({why})")
    return saved
