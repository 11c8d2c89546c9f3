"""Tape format 1: one JSON value a line, a header object first, then one array per record.

Each record is an array whose first item names its kind, then the kind's fields in a fixed
order. `LAYOUT` below declares every kind and its fields, once: the encoder places the
fields by it, the decoder reads them back by it, the header lists it (so a tape explains
itself to anyone who opens it in a text editor), and the table in docs/tapes/README.md is
`layout_markdown()`, which a test keeps in step.

    {"kvscope_tape": 1, "created": "...", "t0": 1234.5, "clock": "perf_counter", ...}
    ["c", at, {model card}]
    ["s", step, started_at, duration_s, ...]
    ...

"s", "t", "a" and "f" may end with one more item, a dict of the event's other fields that
are not at their defaults (`server` and `vllm` timings, `idle`, fields added later).

Every time is the engine's own clock, exactly as the engine stamped it (JSON keeps a
float's every bit), so a replay re-bases them and gets the live values back.

Two things are stored once instead of on every record, because they dominate the size:
- a request's block IDs are written only when they differ from its previous step's
  (`null` otherwise): a decode step rarely changes them, and a step lists every request;
- a finished request's `itl_s` is `null` when it is exactly the gaps between the token
  times already on the tape, which is how every engine computes it.
Both the encoder and the decoder track that state in the same way, record by record.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import operator
import typing
from dataclasses import dataclass
from typing import Any, Literal

from engine import errors as engine_errors
from engine.errors import KvscopeError
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    ModelCard,
    RequestAccepted,
    RequestBlocks,
    RequestFinished,
    RequestWork,
    SamplingSettings,
    StepSample,
    TokenEvent,
    UserMessage,
)
from engine.tape import errors as tape_errors
from engine.tape import values as fv
from engine.tape.errors import RecordedError

if typing.TYPE_CHECKING:
    from collections.abc import Callable, Mapping

FORMAT_VERSION = 1
MAGIC = "kvscope_tape"


class RecordInvalid(ValueError):
    """A line parsed as JSON but is not a record this format knows (the reader says where)."""


# -- the layout --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One fixed place in a record, and what it may hold (checked on every read)."""

    name: str  # the event's field of that name, where the record holds an event
    value: fv.Value
    more: str = ""  # what the header says after the name, for a value packed its own way
    doc: str = ""  # what the docs say about its value, beyond the name

    @property
    def label(self) -> str:
        return self.name + self.more


def _fields(*fields: tuple[str, fv.Value] | Field) -> tuple[Field, ...]:
    return tuple(f if isinstance(f, Field) else Field(*f) for f in fields)


@dataclass(frozen=True)
class RecordLayout:
    """One kind of record: its tag (the record's first item), then its fields in order."""

    tag: str
    says: str  # what it records, for the docs
    fields: tuple[Field, ...]
    extras: type | None = None  # the event whose other fields may follow, as one dict

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names, 1)}

    @functools.cached_property
    def _getter(self) -> Callable[[Any], tuple[Any, ...]]:
        # Every field read off the event at once (C speed: steps and tokens are most records).
        get = operator.attrgetter(*self.names)
        return get if len(self.names) > 1 else lambda obj: (get(obj),)

    def position(self, name: str) -> int:
        """Where the field `name` sits in the record (the tag is item 0)."""
        return self._positions[name]

    def record(self, values: Mapping[str, Any]) -> list[Any]:
        """The record of a kind without extras, from its fields' values by name."""
        return [self.tag, *(values[name] for name in self.names)]

    def take(self, event: Any) -> list[Any]:
        """The record of an event whose fields are all this layout's, as the event holds
        them; the caller then replaces the values packed their own way (`position`)."""
        return [self.tag, *self._getter(event)]

    def with_extras(self, record: list[Any], event: Any) -> list[Any]:
        extra = _extras(event)
        if extra is not None:
            record.append(extra)
        return record

    @functools.cached_property
    def _check(self) -> Callable[[list[Any]], bool]:
        """Whether every field of a record (of the right length) holds what it may: one
        function testing each in turn, built once, as dataclasses builds an __init__, so
        that no loop runs per record (every step and every token is checked)."""
        checks = {f"c{i}": f.value.check for i, f in enumerate(self.fields)}
        body = " and ".join(f"c{i}(r[{i + 1}])" for i in range(len(self.fields)))
        check: Callable[[list[Any]], bool] = eval(f"lambda r: {body}", checks)
        return check

    def read(self, rec: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The record's fields by name, each checked against what it may hold, and its
        extra fields revived ({} when none). Raises RecordInvalid naming the field."""
        size = len(self.fields) + 1
        if len(rec) == size:
            extra = None
        elif len(rec) == size + 1 and self.extras is not None:
            extra = rec[size]
        else:
            raise RecordInvalid(f"a {rec[0]!r} record of {len(rec)} items (expected {size})")
        if not self._check(rec):
            bad = zip(self.fields, rec[1:size], strict=False)
            f, item = next((f, x) for f, x in bad if not f.value.check(x))
            raise RecordInvalid(
                f"a {rec[0]!r} record whose {f.name} is {fv.shown(item)}, not {f.value.words}"
            )
        values = dict(zip(self.names, rec[1:size], strict=False))  # the length is checked
        more = {} if extra is None or self.extras is None else _revive_extras(self.extras, extra)
        return values, more


LAYOUT: tuple[RecordLayout, ...] = (
    RecordLayout(
        "c",
        "the engine started (a restart writes another)",
        _fields(("at", fv.TIME), Field("card", fv.OBJECT, doc="the ModelCard, as an object")),
    ),
    RecordLayout(
        "s",
        "an engine step (StepSample)",
        _fields(
            ("step", fv.STEP_NUMBER),
            ("started_at", fv.TIME),
            ("duration_s", fv.SECONDS),
            ("prefill_tokens", fv.COUNT),
            ("decode_tokens", fv.COUNT),
            ("running", fv.COUNT),
            ("waiting", fv.COUNT),
            Field("kv_usage", fv.KV_USAGE, doc="NaN when unknown, which may be written as null"),
            ("free_blocks", fv.BLOCKS),
            ("total_blocks", fv.BLOCKS),
            ("block_size", fv.BLOCK_SIZE),
            Field(
                "blocks",
                fv.REQUEST_BLOCKS,
                ": [request_id, num_tokens, block_ids or null when unchanged]",
            ),
            ("preemptions", fv.COUNT),
            ("preempted_ids", fv.TEXTS),
            Field("work", fv.WORK, ": [request_id, prefill_tokens, decode_tokens]"),
            ("waiting_ids", fv.TEXTS),
        ),
        extras=StepSample,
    ),
    RecordLayout(
        "r",
        "stream() was called",
        _fields(
            ("at", fv.TIME),
            ("request_id", fv.TEXT),
            Field("messages", fv.MESSAGES, doc="[[role, content], ...]"),
            Field(
                "prompt_ids_len",
                fv.OPT_COUNT,
                doc="the prompt's token count when it was token IDs",
            ),
            Field("sampling", fv.SAMPLING, doc="[max_tokens, temperature, ignore_eos, seed]"),
        ),
    ),
    RecordLayout(
        "a",
        "the engine accepted the request (RequestAccepted)",
        _fields(("request_id", fv.TEXT), ("prompt_tokens", fv.COUNT), ("submitted_at", fv.TIME)),
        extras=RequestAccepted,
    ),
    RecordLayout(
        "t",
        "tokens came (TokenEvent)",
        _fields(
            ("request_id", fv.TEXT),
            ("index", fv.COUNT),
            ("token_ids", fv.TOKEN_IDS),
            ("text", fv.TEXT),
            ("step", fv.STEP_NUMBER),
            ("time_s", fv.TIME),
            ("latency_s", fv.SECONDS),
        ),
        extras=TokenEvent,
    ),
    RecordLayout(
        "f",
        "the request finished (RequestFinished)",
        _fields(
            ("at", fv.TIME),
            ("request_id", fv.TEXT),
            ("reason", fv.FINISH_REASON),
            ("prompt_tokens", fv.COUNT),
            ("output_tokens", fv.COUNT),
            ("ttft_s", fv.OPT_SECONDS),
            Field(
                "itl_s", fv.OPT_SECONDS_LIST, " or null when it is the gaps between the token times"
            ),
            ("e2e_s", fv.SECONDS),
            ("preemptions", fv.COUNT),
        ),
        extras=RequestFinished,
    ),
    RecordLayout(
        "x",
        "the stream raised",
        _fields(
            ("at", fv.TIME),
            ("request_id", fv.TEXT),
            Field("error_type", fv.TEXT, doc="the exception's class name"),
            Field("plain", fv.TEXT, doc="its words"),
            Field(
                "error_args",
                fv.PLAIN_ARGS,
                doc="its arguments, or null when they are not plain values",
            ),
        ),
    ),
    RecordLayout(
        "q",
        "the consumer stopped listening early",
        _fields(("at", fv.TIME), ("request_id", fv.TEXT)),
    ),
    RecordLayout(
        "u",
        "the user sent a message (UserMessage)",
        _fields(
            ("at", fv.TIME),
            ("text", fv.TEXT),
            ("request_ids", fv.TEXTS),
            ("synthetic_tokens", fv.OPT_COUNT),
        ),
    ),
    RecordLayout("n", "a new chat began", _fields(("at", fv.TIME))),
    RecordLayout(
        "e",
        "recording ended",
        _fields(
            ("at", fv.TIME),
            Field(
                "reason",
                fv.TEXT,
                doc='"closed"; "cap" at the size cap; "error" when a write failed',
            ),
            ("detail", fv.TEXT),
        ),
    ),
)
LAYOUT_BY_TAG: dict[str, RecordLayout] = {layout.tag: layout for layout in LAYOUT}

EXTRAS_NOTE = "s, t, a and f records may end with a dict of the event's other fields"
"""The header's word on the extras: its tags are the layouts with `extras` (a test checks)."""


def _header_fields() -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for layout in LAYOUT:
        fields[layout.tag] = [f.label for f in layout.fields]
        if layout.tag == "x":
            fields["+"] = [EXTRAS_NOTE]  # where format 1's header has always had it
    return fields


FIELDS: dict[str, list[str]] = _header_fields()
"""Every kind's fields, as the header lists them."""


def layout_markdown() -> str:
    """The layout as the table in docs/tapes/README.md (a test checks the two agree)."""
    lines = [
        "| record | its items after the tag, in order | what it records |",
        "|---|---|---|",
    ]
    for layout in LAYOUT:
        items = ", ".join(
            f"`{f.name}`{f.more}" + (f" ({f.doc})" if f.doc else "") for f in layout.fields
        )
        lines.append(f'| `"{layout.tag}"` | {items} | {layout.says} |')
    with_extras = [f'`"{layout.tag}"`' for layout in LAYOUT if layout.extras is not None]
    lines += [
        "",
        f"{', '.join(with_extras[:-1])} and {with_extras[-1]} may end with one more item: a "
        "dict of the event's other fields that are not at their defaults.",
    ]
    return "\n".join(lines) + "\n"


Kind = Literal["card", "step", "request", "event", "failure", "abandoned", "message", "chat", "end"]
"""What the writer is handed (the encoder turns each into one record)."""


def stdlib_dumps() -> Callable[[Any], bytes]:
    encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode
    return lambda record: encode(record).encode()


def _fastest_dumps() -> Callable[[Any], bytes]:
    """msgspec's JSON encoder where it is installed (vLLM brings it), else the stdlib's.

    Both write every float in its shortest exact form (the stdlib spells the smallest with
    an exponent, 9.7e-05 for 0.000097: the same number), but msgspec does it about 10x
    faster (0.3 against 3-4 µs a record; benchmarks/tape_cost.py). Any tape reads with
    the stdlib alone.
    """
    try:
        import msgspec
    except ImportError:
        return stdlib_dumps()
    return msgspec.json.Encoder().encode


dumps: Callable[[Any], bytes] = _fastest_dumps()
"""One record as one line of UTF-8 JSON, without the newline."""


def header(*, t0: float, clock: str, created: str, writer: str) -> dict[str, Any]:
    return {
        MAGIC: FORMAT_VERSION,
        "created": created,
        "t0": t0,
        "clock": clock,
        "writer": writer,
        "records": FIELDS,
    }


# -- the records' values -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """A request's stream raised instead of finishing (PromptTooLong, EngineDied, ...)."""

    request_id: str
    error: KvscopeError  # the same type when it can be rebuilt, else a RecordedError
    time_s: float


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The consumer stopped listening before the request finished (a new chat, say)."""

    request_id: str
    time_s: float


@dataclass(frozen=True, slots=True)
class RecordingEnded:
    reason: str  # "closed", "cap" (the size cap was reached) or "error" (a write failed)
    detail: str
    time_s: float


@dataclass(frozen=True, slots=True)
class StartedRequest:
    """`stream()` was called with this request at `time_s`."""

    request: GenerationRequest
    time_s: float
    prompt_ids_len: int | None  # the request's token IDs are not kept, only their count


@dataclass(frozen=True, slots=True)
class NewChat:
    time_s: float


@dataclass(frozen=True, slots=True)
class CardRecord:
    card: ModelCard
    time_s: float


RecordValue = (
    CardRecord
    | StepSample
    | StartedRequest
    | RequestAccepted
    | TokenEvent
    | RequestFinished
    | RecordedFailure
    | Abandoned
    | UserMessage
    | NewChat
    | RecordingEnded
)


# -- fields that may grow ------------------------------------------------------------------------
# The events are shared by several engines and gain fields over time. A record holds the


# -- fields that may grow ------------------------------------------------------------------------
# The events are shared by several engines and gain fields over time. A record holds its
# layout's fields in fixed places and, as an optional last item, a dict of any other
# field whose value is not its default, so a new field is taped without a format change.

_CORE: dict[type, frozenset[str]] = {
    layout.extras: frozenset(layout.names) for layout in LAYOUT if layout.extras is not None
}


_EXTRA_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _extra_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, default) of `cls`'s fields outside its core, the ones taped only when set."""
    known = _EXTRA_FIELDS.get(cls)
    if known is not None:
        return known
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(cls):
        if f.name in _CORE[cls]:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING  # a new required field: always taped
        out.append((f.name, default))
    known = _EXTRA_FIELDS[cls] = tuple(out)
    return known


def _json_value(value: Any) -> Any:
    """A field's value as JSON can hold it (dataclasses as objects, also inside tuples)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    return value


def _extras(obj: Any) -> dict[str, Any] | None:
    extra: dict[str, Any] | None = None
    for name, default in _extra_fields(type(obj)):
        value = getattr(obj, name)
        if value != default:
            if extra is None:
                extra = {}
            extra[name] = _json_value(value)
    return extra


def _revive_extras(cls: type, extra: Any) -> dict[str, Any]:
    if not isinstance(extra, dict):
        raise RecordInvalid(
            f"its last item should be a dict of extra fields, not {fv.shown(extra)}"
        )
    hints = _event_hints(cls)
    # A field this kvscope does not know (a newer writer of the same format) is dropped.
    return {k: fv.revive(hints[k], x, k) for k, x in extra.items() if k in hints}


@functools.cache
def _event_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# -- encoding ----------------------------------------------------------------------------------


class _Tracker:
    """The state both ends keep: each request's last block IDs, and its token times."""

    def __init__(self) -> None:
        self.blocks: dict[str, tuple[int, ...]] = {}
        self.times: dict[str, list[float]] = {}

    def tokens(self, event: TokenEvent) -> None:
        # An engine that preempts by recomputing may send a request's tokens again from
        # an earlier index (the fake does): the times restart there, as the engine's own.
        times = self.times.setdefault(event.request_id, [])
        del times[event.index :]
        times.extend([event.time_s] * len(event.token_ids))

    def gaps(self, request_id: str) -> tuple[float, ...]:
        times = self.times.pop(request_id, [])
        return tuple(b - a for a, b in itertools.pairwise(times))


def _plain_args(args: tuple[Any, ...]) -> list[Any] | None:
    ok = all(isinstance(a, str | int | float | bool | None) for a in args)
    return list(args) if ok else None


_CARD = LAYOUT_BY_TAG["c"]
_STEP = LAYOUT_BY_TAG["s"]
_REQUEST = LAYOUT_BY_TAG["r"]
_ACCEPTED = LAYOUT_BY_TAG["a"]
_TOKEN = LAYOUT_BY_TAG["t"]
_FINISHED = LAYOUT_BY_TAG["f"]
_FAILURE = LAYOUT_BY_TAG["x"]
_ABANDONED = LAYOUT_BY_TAG["q"]
_MESSAGE = LAYOUT_BY_TAG["u"]
_CHAT = LAYOUT_BY_TAG["n"]
_END = LAYOUT_BY_TAG["e"]
_STEP_BLOCKS = _STEP.position("blocks")
_STEP_PREEMPTED = _STEP.position("preempted_ids")
_STEP_WORK = _STEP.position("work")
_STEP_WAITING = _STEP.position("waiting_ids")
_TOKEN_IDS = _TOKEN.position("token_ids")


class Encoder:
    """Turns what the recorder saw into records; one per tape, used by the writer thread."""

    def __init__(self) -> None:
        self._track = _Tracker()

    def encode(self, kind: Kind, value: Any, at: float) -> list[Any]:
        if kind == "step":
            return self._step(value)
        if kind == "event":
            return self._event(value, at)
        if kind == "request":
            r: GenerationRequest = value
            sp = r.sampling
            return _REQUEST.record(
                {
                    "at": at,
                    "request_id": r.request_id,
                    "messages": [[m.role, m.content] for m in r.messages],
                    "prompt_ids_len": None
                    if r.prompt_token_ids is None
                    else len(r.prompt_token_ids),
                    "sampling": [sp.max_tokens, sp.temperature, sp.ignore_eos, sp.seed],
                }
            )
        if kind == "failure":
            rid, exc = value
            return _FAILURE.record(
                {
                    "at": at,
                    "request_id": rid,
                    "error_type": type(exc).__name__,
                    "plain": exc.plain() if isinstance(exc, KvscopeError) else str(exc),
                    "error_args": _plain_args(exc.args) if isinstance(exc, KvscopeError) else None,
                }
            )
        if kind == "abandoned":
            return _ABANDONED.record({"at": at, "request_id": value})
        if kind == "message":
            m: UserMessage = value
            return _MESSAGE.record(
                {
                    "at": m.time_s,
                    "text": m.text,
                    "request_ids": list(m.request_ids),
                    "synthetic_tokens": m.synthetic_tokens,
                }
            )
        if kind == "card":
            # A new engine (a restart): nothing of the old one's state carries over.
            self._track = _Tracker()
            return _CARD.record({"at": at, "card": card_object(value)})
        if kind == "chat":
            return _CHAT.record({"at": at})
        reason, detail = value
        return _END.record({"at": at, "reason": reason, "detail": detail})

    def _step(self, s: StepSample) -> list[Any]:
        previous = self._track.blocks
        now: dict[str, tuple[int, ...]] = {}
        blocks: list[list[Any]] = []
        for b in s.blocks:
            same = previous.get(b.request_id) == b.block_ids
            blocks.append([b.request_id, b.num_tokens, None if same else list(b.block_ids)])
            now[b.request_id] = b.block_ids
        self._track.blocks = now
        record = _STEP.take(s)
        record[_STEP_BLOCKS] = blocks
        record[_STEP_PREEMPTED] = list(s.preempted_ids)
        record[_STEP_WORK] = [[w.request_id, w.prefill_tokens, w.decode_tokens] for w in s.work]
        record[_STEP_WAITING] = list(s.waiting_ids)
        return _STEP.with_extras(record, s)

    def _event(self, e: EngineEvent, at: float) -> list[Any]:
        if isinstance(e, TokenEvent):
            self._track.tokens(e)
            record = _TOKEN.take(e)
            record[_TOKEN_IDS] = list(e.token_ids)
            return _TOKEN.with_extras(record, e)
        if isinstance(e, RequestAccepted):
            return _ACCEPTED.with_extras(_ACCEPTED.take(e), e)
        gaps = self._track.gaps(e.request_id)
        record = _FINISHED.record(
            {
                "at": at,
                "request_id": e.request_id,
                "reason": e.reason,
                "prompt_tokens": e.prompt_tokens,
                "output_tokens": e.output_tokens,
                "ttft_s": e.ttft_s,
                "itl_s": None if gaps == e.itl_s else list(e.itl_s),
                "e2e_s": e.e2e_s,
                "preemptions": e.preemptions,
            }
        )
        return _FINISHED.with_extras(record, e)


# -- decoding ----------------------------------------------------------------------------------


# Card fields added after format 1's first tapes: written only when they say something, so
# a card without them (every tape before them, any engine that does not tell) is written
# exactly as before, and a tape read and written again is the same bytes. Every engine
# says `exact_steps`, so every new tape has it; a card read from an older tape has None.
_LATER_CARD_FIELDS: dict[str, object] = {
    "scheduling": "",
    "kv_groups": (),
    "kv_capacity_tokens": 0,
    "exact_steps": None,
}


def card_object(card: ModelCard) -> dict[str, Any]:
    """The model card as the tape's JSON object."""
    data = dataclasses.asdict(card)
    for name, empty in _LATER_CARD_FIELDS.items():
        if data.get(name) == empty:
            del data[name]
    return data


# A card's figures that size what the screen builds: the block map has one cell a block.
_CARD_BOUNDS = {"total_blocks": fv.MAX_BLOCKS, "block_size": fv.MAX_BLOCK_SIZE}


def decode_card(data: Any) -> ModelCard:
    card = fv.revive(ModelCard, data, "model card")
    if not isinstance(card, ModelCard):  # revive makes the dataclass it is given, or raises
        raise RecordInvalid("its model card is not a JSON object")
    for f in dataclasses.fields(ModelCard):
        value = getattr(card, f.name)
        if type(value) is int and not 0 <= value <= _CARD_BOUNDS.get(f.name, fv.MAX_COUNT):
            most = _CARD_BOUNDS.get(f.name, fv.MAX_COUNT)
            raise RecordInvalid(
                f"its model card says {f.name} {value:,}, past the most a tape may hold "
                f"(0 to {most:,})"
            )
    return card


def rebuild_error(kind: str, words: str, args: list[Any] | None) -> KvscopeError:
    """The recorded error as its own type when it can be rebuilt with the same words, so a
    replay's consumer sees an EngineDied as an EngineDied; else the words alone."""
    for module in (engine_errors, tape_errors):
        cls = getattr(module, kind, None)
        if isinstance(cls, type) and issubclass(cls, KvscopeError) and args is not None:
            try:
                error = cls(*args)
            except Exception:
                break
            if error.plain() == words:
                return error
            break
    return RecordedError(kind, words)


def _when(rec: list[Any], value: RecordValue) -> float:
    if isinstance(value, StepSample):
        return value.started_at + value.duration_s  # its events come when it ends
    if isinstance(value, TokenEvent):
        return value.time_s
    if isinstance(value, RequestAccepted):
        return value.submitted_at
    at = rec[1]
    if not isinstance(at, int | float):
        raise RecordInvalid(f"a {rec[0]!r} record whose time is {at!r}")
    return float(at)


class Decoder:
    """Turns records back into the values the recorder saw, in file order."""

    def __init__(self) -> None:
        self._track = _Tracker()

    def decode(self, rec: Any) -> tuple[RecordValue, float]:
        """The record's value, and when it happened on the engine's clock."""
        if not isinstance(rec, list) or not rec or not isinstance(rec[0], str):
            raise RecordInvalid("not a tape record")
        try:
            value = self._decode(rec)
            return value, _when(rec, value)
        except RecordInvalid:
            raise
        except fv.ValueRefused as exc:
            raise RecordInvalid(f"a {rec[0]!r} record: {exc}") from None
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise RecordInvalid(f"a {rec[0]!r} record that does not read ({exc})") from None

    def _decode(self, rec: list[Any]) -> RecordValue:
        layout = LAYOUT_BY_TAG.get(rec[0])
        if layout is None:
            raise RecordInvalid(f"an unknown record kind {rec[0]!r}")
        v, more = layout.read(rec)
        kind = layout.tag
        if kind == "s":
            return self._step(v, more)
        if kind == "t":
            v["token_ids"] = tuple(v["token_ids"])
            event = TokenEvent(**v, **more)
            self._track.tokens(event)
            return event
        if kind == "a":
            return RequestAccepted(**v, **more)
        if kind == "f":
            del v["at"]
            gaps = self._track.gaps(v["request_id"])
            itl = v["itl_s"]
            v["itl_s"] = gaps if itl is None else tuple(itl)
            return RequestFinished(**v, **more)
        if kind == "r":
            max_tokens, temperature, ignore_eos, seed = v["sampling"]
            request = GenerationRequest(
                v["request_id"],
                messages=tuple(ChatMessage(role, content) for role, content in v["messages"]),
                sampling=SamplingSettings(max_tokens, temperature, ignore_eos, seed),
            )
            return StartedRequest(request, v["at"], v["prompt_ids_len"])
        if kind == "x":
            error = rebuild_error(v["error_type"], v["plain"], v["error_args"])
            return RecordedFailure(v["request_id"], error, v["at"])
        if kind == "q":
            return Abandoned(v["request_id"], v["at"])
        if kind == "u":
            return UserMessage(v["text"], v["at"], tuple(v["request_ids"]), v["synthetic_tokens"])
        if kind == "c":
            self._track = _Tracker()
            return CardRecord(decode_card(v["card"]), v["at"])
        if kind == "n":
            return NewChat(v["at"])
        return RecordingEnded(v["reason"], v["detail"], v["at"])

    def _step(self, v: dict[str, Any], more: dict[str, Any]) -> StepSample:
        previous = self._track.blocks
        now: dict[str, tuple[int, ...]] = {}
        blocks: list[RequestBlocks] = []
        for rid, num_tokens, ids in v["blocks"]:
            if ids is None:
                if rid not in previous:
                    raise RecordInvalid(
                        f"step {v['step']} says the blocks of {rid!r} did not change, but the "
                        "step before does not list them"
                    )
                block_ids = previous[rid]
            else:
                block_ids = tuple(ids)
            now[rid] = block_ids
            blocks.append(RequestBlocks(rid, block_ids, num_tokens))
        self._track.blocks = now
        kv_usage = v["kv_usage"]
        v["kv_usage"] = kv_usage if kv_usage is not None else math.nan
        v["blocks"] = tuple(blocks)
        v["preempted_ids"] = tuple(v["preempted_ids"])
        v["work"] = tuple(RequestWork(rid, p, d) for rid, p, d in v["work"])
        v["waiting_ids"] = tuple(v["waiting_ids"])
        return StepSample(**v, **more)
