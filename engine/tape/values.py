"""What each field of a tape record may hold, and the bounds past which a tape is refused.

A tape is a file anyone can hand kvscope, so every value is checked as it is read: its
type (a step total that is a string, a list where the user's text goes), that it is a
finite number (NaN and Infinity are not times), and that it is within bounds no real
session comes near (a pool of 10^8 blocks would make the block map take gigabytes).
A value that fails is named with what it should have been, and the reader names its
line. The checks are plain functions on the decoded JSON, cheap enough for every record
(about a microsecond a step: benchmarks/tape_cost.py, and the report of issue 22).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from engine.events import FinishReason, StepPerf

if typing.TYPE_CHECKING:
    from collections.abc import Callable

MAX_SECONDS = 1e12
"""Any time or duration: about 31,700 years of any clock's seconds."""
MAX_COUNT = 1 << 40
"""Tokens, steps, requests, preemptions: far past any context or session."""
MAX_BLOCKS = 1 << 24
"""A KV pool's blocks, and any block ID: 16.8 million, past every GPU's pool at the
smallest block size (an 8x H200 box holds about 2 million 16-token blocks of a 7B
model). The block map keeps a few bytes a block; 10^8 would be gigabytes."""
MAX_BLOCK_SIZE = 1 << 20
MAX_NUMBER = 1e15
"""Any other number (a model card's figures, a server's timings)."""
MAX_WORK = 1e21
"""A step's (or a scrape window's) FLOPs or bytes (StepPerf), which pass MAX_NUMBER in
real sessions: a 70B model's 8,192-token prefill is 1.15e15 FLOPs, and a minute's window
on one H200 up to 6e16. 1e21 is a million seconds of an H200's peak."""
MAX_TOKEN_ID = (1 << 31) - 1


class ValueRefused(ValueError):
    """A value that is not what its field holds: `plain` says which and what it should be."""


@dataclass(frozen=True, slots=True)
class Value:
    """What one field holds: `check` says yes or no, `words` what it should have been."""

    words: str
    check: Callable[[Any], bool]


def _seconds(v: Any) -> bool:
    # One chained comparison also refuses NaN and Infinity.
    return (type(v) is float or type(v) is int) and -MAX_SECONDS <= v <= MAX_SECONDS


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_COUNT


def _blocks_count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_BLOCKS


def _step_number(v: Any) -> bool:
    return type(v) is int and -1 <= v <= MAX_COUNT


def _str(v: Any) -> bool:
    return type(v) is str


# The checks of a list's items run in C where they can (map, set, min, max): a decode
# step lists every request, and a token record comes for every token.
_INT = {int}
_STR = {str}
_NUMBERS = {int, float}


def _strs(v: Any) -> bool:
    return type(v) is list and (not v or set(map(type, v)) == _STR)


def _ints(v: Any, most: int) -> bool:
    return type(v) is list and (
        not v or (set(map(type, v)) == _INT and min(v) >= 0 and max(v) <= most)
    )


def _token_ids(v: Any) -> bool:
    return _ints(v, MAX_TOKEN_ID)


def _block_ids(v: Any) -> bool:
    return _ints(v, MAX_BLOCKS - 1)


def _seconds_list(v: Any) -> bool:
    return type(v) is list and (
        not v
        or (
            set(map(type, v)) <= _NUMBERS
            and all(map(math.isfinite, v))
            and min(v) >= -MAX_SECONDS
            and max(v) <= MAX_SECONDS
        )
    )


def _request_blocks(v: Any) -> bool:
    # Plain loops: a step lists every running request, and a generator costs more.
    if type(v) is not list:
        return False
    for b in v:
        if type(b) is not list or len(b) != 3 or type(b[0]) is not str:
            return False
        n, ids = b[1], b[2]
        if type(n) is not int or not 0 <= n <= MAX_COUNT:
            return False
        if ids is not None and not _block_ids(ids):
            return False
    return True


def _work(v: Any) -> bool:
    if type(v) is not list:
        return False
    for w in v:
        if type(w) is not list or len(w) != 3 or type(w[0]) is not str:
            return False
        p, d = w[1], w[2]
        if (
            type(p) is not int
            or type(d) is not int
            or not (0 <= p <= MAX_COUNT and 0 <= d <= MAX_COUNT)
        ):
            return False
    return True


def _messages(v: Any) -> bool:
    return type(v) is list and all(
        type(m) is list and len(m) == 2 and type(m[0]) is str and type(m[1]) is str for m in v
    )


def _sampling(v: Any) -> bool:
    return (
        type(v) is list
        and len(v) == 4
        and _count(v[0])
        and (type(v[1]) is float or type(v[1]) is int)
        and -MAX_NUMBER <= v[1] <= MAX_NUMBER
        and type(v[2]) is bool
        and (v[3] is None or (type(v[3]) is int and abs(v[3]) <= MAX_COUNT))
    )


def _kv_usage(v: Any) -> bool:
    # NaN (unknown) is written as null by msgspec and as NaN by the stdlib's encoder.
    return v is None or v != v or ((type(v) is float or type(v) is int) and 0 <= v <= 1e3)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _plain_args(v: Any) -> bool:
    return v is None or (
        type(v) is list
        and all(
            x is None or type(x) in (str, bool, int) or (type(x) is float and _seconds(x))
            for x in v
        )
    )


TIME = Value("a time in seconds (a finite number)", _seconds)
SECONDS = Value("a duration in seconds (a finite number)", _seconds)
OPT_SECONDS = Value("a duration in seconds or null", _optional(_seconds))
SECONDS_LIST = Value("a list of durations in seconds", _seconds_list)
OPT_SECONDS_LIST = Value("a list of durations in seconds, or null", _optional(SECONDS_LIST.check))
COUNT = Value(f"a whole number from 0 to {MAX_COUNT:,}", _count)
OPT_COUNT = Value(f"null or a whole number from 0 to {MAX_COUNT:,}", _optional(_count))
STEP_NUMBER = Value("a step number (a whole number)", _step_number)
BLOCKS = Value(f"a block count from 0 to {MAX_BLOCKS:,}", _blocks_count)
BLOCK_SIZE = Value(
    f"a block size from 0 to {MAX_BLOCK_SIZE:,}",
    lambda v: type(v) is int and 0 <= v <= MAX_BLOCK_SIZE,
)
KV_USAGE = Value("a KV usage from 0 to 1 (or null when unknown)", _kv_usage)
TEXT = Value("a string", _str)
TEXTS = Value("a list of strings", _strs)
TOKEN_IDS = Value("a list of token IDs", _token_ids)
REQUEST_BLOCKS = Value(
    f"a list of [request_id, num_tokens, block IDs below {MAX_BLOCKS:,} or null]",
    _request_blocks,
)
WORK = Value("a list of [request_id, prefill_tokens, decode_tokens]", _work)
MESSAGES = Value("a list of [role, content] strings", _messages)
SAMPLING = Value("[max_tokens, temperature, ignore_eos, seed]", _sampling)
FINISH_REASON = Value(
    " or ".join(repr(r) for r in typing.get_args(FinishReason)),
    lambda v: v in typing.get_args(FinishReason),
)
OBJECT = Value("a JSON object", lambda v: type(v) is dict)
PLAIN_ARGS = Value("null or a list of plain values", _plain_args)


def shown(value: Any) -> str:
    """A value as a message quotes it: short, whatever its size."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- values typed by an event's fields (a record's extras, the model card) --------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_NONE = type(None)


def revive(hint: Any, value: Any, where: str) -> Any:
    """A JSON value back as the type `hint` names, checked on the way: dicts become the
    dataclass the hint names (or one of its union's members), lists become tuples, as the
    events hold them; a number must be finite and within bounds. Raises ValueRefused,
    naming `where` (a field of a record: "card's total_blocks")."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None:
            if _NONE in args:
                return None
            raise ValueRefused(f"its {where} is null, not {_kind(hint)}")
        members = [a for a in args if a is not _NONE]
        for member in members[:-1]:
            try:
                return revive(member, value, where)
            except ValueRefused:
                continue
        return revive(members[-1], value, where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if type(value) is not dict:
            raise ValueRefused(f"its {where} is {shown(value)}, not a JSON object")
        hints = _hints(hint)
        wide = hint in _WORK_COUNTS
        known = {
            k: _work_count(v, f"{where}'s {k}")
            if wide and hints[k] is float
            else revive(hints[k], v, f"{where}'s {k}")
            for k, v in value.items()
            if k in hints
        }
        try:
            return hint(**known)
        except TypeError:
            missing = [
                f.name
                for f in dataclasses.fields(hint)
                if f.name not in known
                and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING
            ]
            raise ValueRefused(
                f"its {where} has no {', '.join(missing) or 'usable'} field"
            ) from None
    if origin is tuple:
        if type(value) is not list:
            raise ValueRefused(f"its {where} is {shown(value)}, not a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(revive(args[0], v, where) for v in value)
        if args and len(args) != len(value):
            raise ValueRefused(f"its {where} is {shown(value)}, not a list of {len(args)}")
        if args:
            return tuple(revive(a, v, where) for a, v in zip(args, value, strict=True))
        return tuple(value)
    if origin is typing.Literal:
        if value not in args:
            raise ValueRefused(
                f"its {where} is {shown(value)}, not one of {', '.join(map(repr, args))}"
            )
        return value
    ok = _SCALARS.get(hint)
    if ok is not None and not ok(value):
        raise ValueRefused(f"its {where} is {shown(value)}, not {_kind(hint)}")
    if hint is Any and type(value) is list:
        return tuple(revive(Any, v, where) for v in value)
    return value


def _number(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and -MAX_NUMBER <= v <= MAX_NUMBER


_WORK_COUNTS: frozenset[type] = frozenset({StepPerf})
"""The dataclasses whose numbers are FLOPs and bytes, bounded by MAX_WORK, not MAX_NUMBER."""


def _work_count(value: Any, where: str) -> float:
    if (type(value) is float or type(value) is int) and 0 <= value <= MAX_WORK:
        return float(value)
    raise ValueRefused(f"its {where} is {shown(value)}, not a count from 0 to {MAX_WORK:g}")


_SCALARS: dict[Any, Callable[[Any], bool]] = {
    str: _str,
    bool: lambda v: type(v) is bool,
    int: lambda v: type(v) is int and -MAX_COUNT <= v <= MAX_COUNT,
    float: _number,
    dict: lambda v: type(v) is dict,
}


def _kind(hint: Any) -> str:
    return {
        str: "a string",
        bool: "true or false",
        int: "a whole number within bounds",
        float: "a finite number within bounds",
    }.get(hint, str(hint).replace("typing.", ""))
