"""Tape format 1: one JSON value a line, a header object first, then one array per record.

Each record is an array whose first item names its kind; the header lists every kind's
fields, so a tape explains itself to anyone who opens it in a text editor:

    {"kvscope_tape": 1, "created": "...", "t0": 1234.5, "clock": "perf_counter", ...}
    ["c", at, {model card}]                                            the engine started
    ["s", step, started_at, duration_s, prefill, decode, running, waiting, kv_usage,
          free_blocks, total_blocks, block_size, blocks, preemptions, preempted_ids,
          work, waiting_ids]
    ["r", at, request_id, messages, prompt_ids_len, sampling]          stream() was called
    ["a", request_id, prompt_tokens, submitted_at]                     RequestAccepted
    ["t", request_id, index, token_ids, text, step, time_s, latency_s] TokenEvent
    ["f", at, request_id, reason, prompt_tokens, output_tokens, ttft_s, itl_s, e2e_s,
          preemptions]                                                 RequestFinished
    ["x", at, request_id, error_type, plain_words, error_args]         the stream raised
    ["q", at, request_id]                           the consumer stopped listening early
    ["u", at, text, request_ids, synthetic_tokens]                     UserMessage
    ["n", at]                                                          a new chat began
    ["e", at, reason, detail]                                          recording ended

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
from engine.tape.errors import RecordedError

if typing.TYPE_CHECKING:
    from collections.abc import Callable

FORMAT_VERSION = 1
MAGIC = "kvscope_tape"

FIELDS: dict[str, list[str]] = {
    "c": ["at", "card"],
    "s": [
        "step",
        "started_at",
        "duration_s",
        "prefill_tokens",
        "decode_tokens",
        "running",
        "waiting",
        "kv_usage",
        "free_blocks",
        "total_blocks",
        "block_size",
        "blocks: [request_id, num_tokens, block_ids or null when unchanged]",
        "preemptions",
        "preempted_ids",
        "work: [request_id, prefill_tokens, decode_tokens]",
        "waiting_ids",
    ],
    "r": ["at", "request_id", "messages", "prompt_ids_len", "sampling"],
    "a": ["request_id", "prompt_tokens", "submitted_at"],
    "t": ["request_id", "index", "token_ids", "text", "step", "time_s", "latency_s"],
    "f": [
        "at",
        "request_id",
        "reason",
        "prompt_tokens",
        "output_tokens",
        "ttft_s",
        "itl_s or null when it is the gaps between the token times",
        "e2e_s",
        "preemptions",
    ],
    "x": ["at", "request_id", "error_type", "plain", "error_args"],
    "+": ["s, t, a and f records may end with a dict of the event's other fields"],
    "q": ["at", "request_id"],
    "u": ["at", "text", "request_ids", "synthetic_tokens"],
    "n": ["at"],
    "e": ["at", "reason", "detail"],
}

Kind = Literal["card", "step", "request", "event", "failure", "abandoned", "message", "chat", "end"]
"""What the writer is handed (the encoder turns each into one record)."""


def stdlib_dumps() -> Callable[[Any], bytes]:
    encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode
    return lambda record: encode(record).encode()


def _fastest_dumps() -> Callable[[Any], bytes]:
    """msgspec's JSON encoder where it is installed (vLLM brings it), else the stdlib's.

    Both write the same JSON text, every float in its shortest exact form, but msgspec
    does it about 10x faster (0.3 against 3-4 µs a record; benchmarks/tape_cost.py). The
    file is the same either way, so any tape reads with the stdlib alone.
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
# fields named below in fixed places and, as an optional last item, a dict of any other
# field whose value is not its default, so a new field is taped without a format change.

_CORE: dict[type, tuple[str, ...]] = {
    StepSample: (
        "step",
        "started_at",
        "duration_s",
        "prefill_tokens",
        "decode_tokens",
        "running",
        "waiting",
        "kv_usage",
        "free_blocks",
        "total_blocks",
        "block_size",
        "blocks",
        "preemptions",
        "preempted_ids",
        "work",
        "waiting_ids",
    ),
    TokenEvent: ("request_id", "index", "token_ids", "text", "step", "time_s", "latency_s"),
    RequestAccepted: ("request_id", "prompt_tokens", "submitted_at"),
    RequestFinished: (
        "request_id",
        "reason",
        "prompt_tokens",
        "output_tokens",
        "ttft_s",
        "itl_s",
        "e2e_s",
        "preemptions",
    ),
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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def revive(hint: Any, value: Any) -> Any:
    """A JSON value back as the type `hint` names: dicts become the dataclass the hint
    names (or one of its union's members), lists become tuples, as the events hold them."""
    if isinstance(value, dict):
        for t in (hint, *typing.get_args(hint)):
            if isinstance(t, type) and dataclasses.is_dataclass(t):
                hints = _hints(t)
                return t(**{k: revive(hints[k], v) for k, v in value.items() if k in hints})
        return value
    if isinstance(value, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = args[0] if len(args) == 1 else Any
        return tuple(revive(inner, v) for v in value)
    return value


def _revive_extras(cls: type, extra: Any) -> dict[str, Any]:
    if not isinstance(extra, dict):
        raise RecordInvalid(f"its last item should be a dict of extra fields, not {extra!r}")
    hints = _hints(cls)
    # A field this kvscope does not know (a newer writer of the same format) is dropped.
    return {k: revive(hints[k], v) for k, v in extra.items() if k in hints}


def _with_extras(record: list[Any], obj: Any) -> list[Any]:
    extra = _extras(obj)
    if extra is not None:
        record.append(extra)
    return record


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
            return [
                "r",
                at,
                r.request_id,
                [[m.role, m.content] for m in r.messages],
                None if r.prompt_token_ids is None else len(r.prompt_token_ids),
                [sp.max_tokens, sp.temperature, sp.ignore_eos, sp.seed],
            ]
        if kind == "failure":
            rid, exc = value
            words = exc.plain() if isinstance(exc, KvscopeError) else str(exc)
            args = _plain_args(exc.args) if isinstance(exc, KvscopeError) else None
            return ["x", at, rid, type(exc).__name__, words, args]
        if kind == "abandoned":
            return ["q", at, value]
        if kind == "message":
            m: UserMessage = value
            return ["u", m.time_s, m.text, list(m.request_ids), m.synthetic_tokens]
        if kind == "card":
            # A new engine (a restart): nothing of the old one's state carries over.
            self._track = _Tracker()
            return ["c", at, dataclasses.asdict(value)]
        if kind == "chat":
            return ["n", at]
        reason, detail = value
        return ["e", at, reason, detail]

    def _step(self, s: StepSample) -> list[Any]:
        previous = self._track.blocks
        now: dict[str, tuple[int, ...]] = {}
        blocks: list[list[Any]] = []
        for b in s.blocks:
            same = previous.get(b.request_id) == b.block_ids
            blocks.append([b.request_id, b.num_tokens, None if same else list(b.block_ids)])
            now[b.request_id] = b.block_ids
        self._track.blocks = now
        record = [
            "s",
            s.step,
            s.started_at,
            s.duration_s,
            s.prefill_tokens,
            s.decode_tokens,
            s.running,
            s.waiting,
            s.kv_usage,
            s.free_blocks,
            s.total_blocks,
            s.block_size,
            blocks,
            s.preemptions,
            list(s.preempted_ids),
            [[w.request_id, w.prefill_tokens, w.decode_tokens] for w in s.work],
            list(s.waiting_ids),
        ]
        return _with_extras(record, s)

    def _event(self, e: EngineEvent, at: float) -> list[Any]:
        if isinstance(e, TokenEvent):
            self._track.tokens(e)
            record = [
                "t",
                e.request_id,
                e.index,
                list(e.token_ids),
                e.text,
                e.step,
                e.time_s,
                e.latency_s,
            ]
        elif isinstance(e, RequestAccepted):
            record = ["a", e.request_id, e.prompt_tokens, e.submitted_at]
        else:
            gaps = self._track.gaps(e.request_id)
            record = [
                "f",
                at,
                e.request_id,
                e.reason,
                e.prompt_tokens,
                e.output_tokens,
                e.ttft_s,
                None if gaps == e.itl_s else list(e.itl_s),
                e.e2e_s,
                e.preemptions,
            ]
        return _with_extras(record, e)


# -- decoding ----------------------------------------------------------------------------------


class RecordInvalid(ValueError):
    """A line parsed as JSON but is not a record this format knows (the reader says where)."""


def decode_card(data: Any) -> ModelCard:
    card = revive(ModelCard, data)
    if not isinstance(card, ModelCard):
        raise RecordInvalid("its model card is not a JSON object")
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


def _split(rec: list[Any], size: int) -> tuple[list[Any], dict[str, Any] | None]:
    """A record's fixed items, and its extra fields when it has them."""
    if len(rec) == size:
        return rec, None
    if len(rec) == size + 1:
        return rec[:size], rec[size]
    raise RecordInvalid(f"a {rec[0]!r} record of {len(rec)} items (expected {size})")


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
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise RecordInvalid(f"a {rec[0]!r} record that does not read ({exc})") from None

    def _decode(self, rec: list[Any]) -> RecordValue:
        kind = rec[0]
        if kind == "s":
            return self._step(rec)
        if kind == "t":
            fixed, extra = _split(rec, 8)
            _, rid, index, ids, text, step, time_s, latency_s = fixed
            more = {} if extra is None else _revive_extras(TokenEvent, extra)
            event = TokenEvent(rid, index, tuple(ids), text, step, time_s, latency_s, **more)
            self._track.tokens(event)
            return event
        if kind == "a":
            fixed, extra = _split(rec, 4)
            _, rid, prompt_tokens, submitted_at = fixed
            more = {} if extra is None else _revive_extras(RequestAccepted, extra)
            return RequestAccepted(rid, prompt_tokens, submitted_at, **more)
        if kind == "f":
            fixed, extra = _split(rec, 10)
            _, _at, rid, reason, prompt, output, ttft, itl, e2e, preemptions = fixed
            more = {} if extra is None else _revive_extras(RequestFinished, extra)
            gaps = self._track.gaps(rid)
            return RequestFinished(
                request_id=rid,
                reason=reason,
                prompt_tokens=prompt,
                output_tokens=output,
                ttft_s=ttft,
                itl_s=gaps if itl is None else tuple(itl),
                e2e_s=e2e,
                preemptions=preemptions,
                **more,
            )
        if kind == "r":
            _, at, rid, messages, ids_len, sampling = rec
            max_tokens, temperature, ignore_eos, seed = sampling
            request = GenerationRequest(
                rid,
                messages=tuple(ChatMessage(role, content) for role, content in messages),
                sampling=SamplingSettings(max_tokens, temperature, ignore_eos, seed),
            )
            return StartedRequest(request, at, ids_len)
        if kind == "x":
            _, at, rid, error_type, words, args = rec
            return RecordedFailure(rid, rebuild_error(error_type, words, args), at)
        if kind == "q":
            _, at, rid = rec
            return Abandoned(rid, at)
        if kind == "u":
            _, at, text, rids, synthetic = rec
            return UserMessage(text, at, tuple(rids), synthetic)
        if kind == "c":
            _, at, card = rec
            self._track = _Tracker()
            return CardRecord(decode_card(card), at)
        if kind == "n":
            return NewChat(rec[1])
        if kind == "e":
            _, at, reason, detail = rec
            return RecordingEnded(reason, detail, at)
        raise RecordInvalid(f"an unknown record kind {kind!r}")

    def _step(self, rec: list[Any]) -> StepSample:
        fixed, extra = _split(rec, 17)
        (
            _,
            step,
            started_at,
            duration_s,
            prefill,
            decode,
            running,
            waiting,
            kv_usage,
            free,
            total,
            block_size,
            raw_blocks,
            preemptions,
            preempted,
            work,
            waiting_ids,
        ) = fixed
        previous = self._track.blocks
        now: dict[str, tuple[int, ...]] = {}
        blocks: list[RequestBlocks] = []
        for rid, num_tokens, ids in raw_blocks:
            if ids is None:
                if rid not in previous:
                    raise RecordInvalid(
                        f"step {step} says the blocks of {rid!r} did not change, but the "
                        "step before does not list them"
                    )
                block_ids = previous[rid]
            else:
                block_ids = tuple(ids)
            now[rid] = block_ids
            blocks.append(RequestBlocks(rid, block_ids, num_tokens))
        self._track.blocks = now
        more = {} if extra is None else _revive_extras(StepSample, extra)
        return StepSample(
            step=step,
            started_at=started_at,
            duration_s=duration_s,
            prefill_tokens=prefill,
            decode_tokens=decode,
            running=running,
            waiting=waiting,
            kv_usage=kv_usage if kv_usage is not None else math.nan,
            free_blocks=free,
            total_blocks=total,
            block_size=block_size,
            blocks=tuple(blocks),
            preemptions=preemptions,
            preempted_ids=tuple(preempted),
            work=tuple(RequestWork(rid, p, d) for rid, p, d in work),
            waiting_ids=tuple(waiting_ids),
            **more,
        )
