"""Reading a tape back: every record as the value the recorder saw, and the session's shape.

`read_tape(path)` returns a `Tape` or raises a `TapeError` whose `plain()` is one sentence.
A last line cut by a crash is skipped and kept as a `TornLastLine` warning on the tape.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    ModelCard,
    RequestAccepted,
    RequestFinished,
    StepSample,
    TokenEvent,
    UserMessage,
)
from engine.features import REMOTE_DEVICE_PREFIX
from engine.input_files import NotAFile, open_regular_file
from engine.sizes import MIB
from engine.tape.errors import (
    NotATape,
    TapeCorrupt,
    TapeEmpty,
    TapeNotFound,
    TapeTooNew,
    TornLastLine,
)
from engine.tape.format import (
    FORMAT_VERSION,
    MAGIC,
    Abandoned,
    CardRecord,
    Decoder,
    NewChat,
    RecordedFailure,
    RecordingEnded,
    RecordInvalid,
    RecordValue,
    StartedRequest,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.errors import KvscopeError

log = logging.getLogger("kvscope")

# A header is about 2 KB; a file with no line break this early is not a tape.
_HEADER_LIMIT = 64 * 1024
LINE_LIMIT = 64 * MIB
"""The longest record a tape may hold. The longest real ones are steps of a full pool (a
thousand requests of a thousand blocks each is about 8 MB); a line is never read past
this, so a 500 MB line costs 64 MB, not gigabytes."""


def _fastest_loads() -> Callable[[bytes], Any]:
    """msgspec's JSON decoder where it is installed (vLLM brings it), else the stdlib's.

    msgspec parses a record about 6x faster (0.7 against 4-9 µs), which pays for checking
    every value several times over. It takes strict JSON only: a line it refuses (NaN from
    the stdlib's writer, damage) is parsed again by the stdlib, which reads the NaN or
    says what is wrong, so both read every tape the same way.
    """
    try:
        import msgspec
    except ImportError:
        return json.loads
    decode = msgspec.json.Decoder().decode
    refused = msgspec.DecodeError

    def loads(line: bytes) -> Any:
        try:
            return decode(line)
        except refused:
            return json.loads(line)

    return loads


_loads = _fastest_loads()

RequestStatus = Literal["finished", "failed", "abandoned", "interrupted"]
"""How a recorded request ended: finished (stop, length or abort), its stream raised, its
consumer stopped listening, or the tape ends before any of these (a crash mid-reply)."""


@dataclass(frozen=True)
class RecordedRequest:
    """One `stream()` call of the session, as its consumer saw it."""

    request: GenerationRequest  # its token IDs are not taped: see `prompt_tokens`
    started_at: float  # when stream() was called, on the engine's clock
    events: tuple[EngineEvent, ...]  # accepted, tokens, finished, in the order they came
    failure: RecordedFailure | None = None
    abandoned_at: float | None = None
    message: UserMessage | None = None  # the user message that started it, if any
    prompt_ids_len: int | None = None  # set when the request was made of token IDs

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def accepted(self) -> RequestAccepted | None:
        return next((e for e in self.events if isinstance(e, RequestAccepted)), None)

    @property
    def finished(self) -> RequestFinished | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, RequestFinished) else None

    @property
    def tokens(self) -> tuple[TokenEvent, ...]:
        return tuple(e for e in self.events if isinstance(e, TokenEvent))

    @property
    def text(self) -> str:
        """The reply so far (all of it when finished, the partial reply otherwise)."""
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent))

    @property
    def prompt_tokens(self) -> int | None:
        accepted = self.accepted
        return accepted.prompt_tokens if accepted is not None else self.prompt_ids_len

    @property
    def status(self) -> RequestStatus:
        if self.finished is not None:
            return "finished"
        if self.failure is not None:
            return "failed"
        if self.abandoned_at is not None:
            return "abandoned"
        return "interrupted"


@dataclass(frozen=True)
class Turn:
    """One send: the user's message (None for a request no user typed) and its requests."""

    message: UserMessage | None
    requests: tuple[RecordedRequest, ...]


@dataclass(frozen=True)
class TapeEntry:
    """One record in file order; `request` indexes `Tape.requests` for stream records."""

    value: RecordValue
    at: float  # when it happened, on the engine's clock (a step: when it ended)
    request: int = -1


@dataclass(frozen=True)
class Tape:
    path: Path
    version: int
    created: str
    clock: str  # "perf_counter" (a real engine) or "virtual" (a scripted one)
    cards: tuple[ModelCard, ...]  # one per engine start; a restart adds one
    steps: tuple[StepSample, ...]
    requests: tuple[RecordedRequest, ...]
    messages: tuple[UserMessage, ...]
    new_chats: tuple[float, ...]  # when the user started a new chat
    end: RecordingEnded | None  # None: the recording was cut off (a crash, a kill)
    warnings: tuple[KvscopeError, ...]
    entries: tuple[TapeEntry, ...] = field(repr=False)
    size_bytes: int = 0

    @property
    def card(self) -> ModelCard | None:
        return self.cards[0] if self.cards else None

    @property
    def exact_steps(self) -> bool:
        """Whether the tape's steps are its engine's real steps (ModelCard.exact_steps),
        not windows between scrapes of a server."""
        card = self.card
        if card is None:
            return True  # no engine started: no server was scraped either
        if card.exact_steps is not None:
            return card.exact_steps
        # A tape recorded before the card said so. Only a server's card named its device
        # "remote <url>", so that rule, which such tapes were always read by, still answers.
        return not card.device.startswith(REMOTE_DEVICE_PREFIX)

    @property
    def output_tokens(self) -> int:
        return sum(len(t.token_ids) for r in self.requests for t in r.tokens)

    def turns(self) -> tuple[Turn, ...]:
        """Every send in order: a user message with its requests, or a lone request."""
        claimed: dict[str, UserMessage] = {}
        for m in self.messages:
            for rid in m.request_ids:
                claimed.setdefault(rid, m)
        out: list[Turn] = []
        by_message: dict[int, list[RecordedRequest]] = {}
        order: list[tuple[float, UserMessage | None, RecordedRequest | None]] = []
        for m in self.messages:
            order.append((m.time_s, m, None))
        for r in self.requests:
            if r.message is not None:
                by_message.setdefault(id(r.message), []).append(r)
            else:
                order.append((r.started_at, None, r))
        order.sort(key=lambda x: x[0])
        for _, message, lone in order:
            if message is not None:
                out.append(Turn(message, tuple(by_message.get(id(message), ()))))
            elif lone is not None:
                out.append(Turn(None, (lone,)))
        return tuple(out)

    def chat_history(self) -> tuple[ChatMessage, ...]:
        """What the model had seen of the last chat, with the last reply (whole or partial)
        added: the conversation `--resume` goes on with. Synthetic-prompt turns are not
        part of it, as live."""
        for turn in reversed(self.last_chat()):
            chat = next((r for r in turn.requests if r.request.messages), None)
            if chat is None:
                continue
            reply = chat.text
            tail = (ChatMessage("assistant", reply),) if reply else ()
            return (*chat.request.messages, *tail)
        return ()

    def last_chat(self) -> tuple[Turn, ...]:
        """The turns since the last new chat: what `--resume` puts back on the screen."""
        since = self.new_chats[-1] if self.new_chats else float("-inf")
        return tuple(
            t
            for t in self.turns()
            if (t.message.time_s if t.message else t.requests[0].started_at) >= since
        )


@dataclass
class _Building:
    request: GenerationRequest
    started_at: float
    prompt_ids_len: int | None
    events: list[EngineEvent] = field(default_factory=list)
    failure: RecordedFailure | None = None
    abandoned_at: float | None = None
    message: UserMessage | None = None
    closed: bool = False

    def freeze(self) -> RecordedRequest:
        return RecordedRequest(
            request=self.request,
            started_at=self.started_at,
            events=tuple(self.events),
            failure=self.failure,
            abandoned_at=self.abandoned_at,
            message=self.message,
            prompt_ids_len=self.prompt_ids_len,
        )


def _event_time(value: EngineEvent) -> float:
    if isinstance(value, RequestAccepted):
        return value.submitted_at
    if isinstance(value, TokenEvent):
        return value.time_s
    return 0.0


def read_header(path: Path, first: bytes, size: int) -> dict[str, Any]:
    if not first.endswith(b"\n") and size > len(first):
        raise NotATape(path, "its first 64 KiB hold no line break")
    try:
        head = json.loads(first.decode("utf-8"))
    except UnicodeDecodeError:
        raise NotATape(path, "it is not text") from None
    except (ValueError, RecursionError):
        raise NotATape(path, "its first line is not a tape header (not JSON)") from None
    if not isinstance(head, dict) or MAGIC not in head:
        raise NotATape(path, f"its first line has no {MAGIC!r} header")
    version = head[MAGIC]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise NotATape(path, f"its header names format version {version!r}")
    if version > FORMAT_VERSION:
        raise TapeTooNew(path, version, FORMAT_VERSION)
    return head


def read_tape(path: str | Path) -> Tape:
    """Read a whole tape. Raises a TapeError; a torn last line is only a warning."""
    path = Path(path)
    try:
        f, size = open_regular_file(path)
    except NotAFile as exc:
        if exc.missing:
            raise TapeNotFound(path) from None
        tail = "" if exc.folder or "cannot be opened" in exc.why else "; a tape is a file"
        raise NotATape(path, exc.why + tail) from None
    with f:
        if size == 0:
            raise TapeEmpty(path)
        first = f.readline(_HEADER_LIMIT)
        head = read_header(path, first, size)
        return _read_records(path, f, head, size)


def _read_records(path: Path, f: Any, head: dict[str, Any], size: int) -> Tape:
    decoder = Decoder()
    cards: list[ModelCard] = []
    steps: list[StepSample] = []
    requests: list[_Building] = []
    live: dict[str, list[int]] = {}  # request ID -> indices of its streams, latest last
    messages: list[UserMessage] = []
    pending_message: dict[str, UserMessage] = {}
    new_chats: list[float] = []
    entries: list[TapeEntry] = []
    warnings: list[KvscopeError] = []
    end: RecordingEnded | None = None

    def stream_of(rid: str, at: float) -> int:
        # The latest stream of that ID still open: a duplicate ID is refused at once, and
        # what follows its refusal belongs to the stream it duplicated.
        index = next((i for i in reversed(live.get(rid, ())) if not requests[i].closed), None)
        if index is None:
            # The tape began mid-stream (or the stream() record was lost): still keep it.
            requests.append(_Building(GenerationRequest(rid), at, None))
            index = len(requests) - 1
            live.setdefault(rid, []).append(index)
        return index

    def read_line(number: int) -> bytes:
        # Never more than the limit: a longer line is refused, not read whole first.
        line: bytes = f.readline(LINE_LIMIT + 1)
        if len(line) > LINE_LIMIT:
            raise TapeCorrupt(
                path,
                number,
                f"a line longer than {LINE_LIMIT:,} bytes, the most a record may be",
            )
        return line

    number = 1
    line = read_line(2)
    while line:
        number += 1
        following = read_line(number + 1)
        try:
            value, at = decoder.decode(_loads(line))
        except (ValueError, RecordInvalid, RecursionError) as exc:
            # JSONDecodeError and UnicodeDecodeError are ValueErrors too. Only a last
            # line without its line break was cut by a crash; a whole one is damage.
            if following or line.endswith(b"\n"):
                if isinstance(exc, RecordInvalid):
                    detail = str(exc.args[0])
                elif isinstance(exc, RecursionError):
                    detail = "JSON nested too deep to be a record"
                else:
                    detail = "not JSON"
                raise TapeCorrupt(path, number, detail) from None
            warning = TornLastLine(path, number, len(line), len(steps))
            log.warning("kvscope: %s", warning.plain())
            warnings.append(warning)
            break
        line = following
        index = -1
        if isinstance(value, StepSample):
            steps.append(value)
        elif isinstance(value, StartedRequest):
            rid = value.request.request_id
            building = _Building(value.request, value.time_s, value.prompt_ids_len)
            building.message = pending_message.pop(rid, None)
            requests.append(building)
            index = len(requests) - 1
            live.setdefault(rid, []).append(index)
        elif isinstance(value, RequestAccepted | TokenEvent | RequestFinished):
            index = stream_of(value.request_id, _event_time(value))
            requests[index].events.append(value)
            if isinstance(value, RequestFinished):
                requests[index].closed = True
        elif isinstance(value, RecordedFailure | Abandoned):
            index = stream_of(value.request_id, value.time_s)
            if isinstance(value, RecordedFailure):
                requests[index].failure = value
            else:
                requests[index].abandoned_at = value.time_s
            requests[index].closed = True
        elif isinstance(value, UserMessage):
            messages.append(value)
            for rid in value.request_ids:
                pending_message[rid] = value
        elif isinstance(value, CardRecord):
            cards.append(value.card)
        elif isinstance(value, NewChat):
            new_chats.append(value.time_s)
        elif isinstance(value, RecordingEnded):
            end = value
        entries.append(TapeEntry(value, at, index))
    return Tape(
        path=path,
        version=int(head[MAGIC]),
        created=str(head.get("created", "")),
        clock=str(head.get("clock", "")),
        cards=tuple(cards),
        steps=tuple(steps),
        requests=tuple(b.freeze() for b in requests),
        messages=tuple(messages),
        new_chats=tuple(new_chats),
        end=end,
        warnings=tuple(warnings),
        entries=tuple(entries),
        size_bytes=size,
    )
