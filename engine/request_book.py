"""The bookkeeping of every request an engine has in flight, the same for all four engines.

A `LiveRequest` is one request in flight: what it asked, the queue its consumer reads, and
its `RequestTimes`, the one place a token's time and latency are stamped and a request is
summed up. Every time counts from `submitted_at`, when the caller called `stream()`, and
every token carries the time the engine made it (a step's end, a chunk's arrival), never
the time a consumer read it.

A `RequestBook` holds an engine's requests in two tables:
- the open streams, by request ID, which any thread may ask (under a lock): a `stream()` of
  an ID whose request has not ended yet raises DuplicateRequestId before any event;
- the live requests, the engine's own table of what it runs. Only the engine's own thread
  touches it (VllmEngine's step thread; the event loop of the fake).

`RequestBook.stream()` is every engine's `stream()` relay: it hands a request's events from
its queue to the consumer, and a consumer that walks away aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from engine.anatomy import AnatomyClock
from engine.errors import DuplicateRequestId, PromptTooLong
from engine.events import (
    EngineEvent,
    FinishReason,
    GenerationRequest,
    RequestAccepted,
    RequestFinished,
    StepSample,
    TokenEvent,
    VllmTimings,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping

Item = EngineEvent | BaseException
"""What a request's queue carries: its events, or the error its stream raises."""


class Inbox(asyncio.Queue[Item]):
    """A request's queue: one reader (its stream), every put on the reader's loop.

    asyncio.Queue's put_nowait and get are general (many getters, a bounded size,
    task_done's counting): per token at 256 streams they were a tenth of the consumer's
    CPU (benchmarks/load_truth.py). This one keeps the face the engines hand items to
    (`put_nowait`) and wakes its single reader directly. There is no size limit, and no
    task_done or join: nobody waits for a request's events to be worked through.
    """

    def __init__(self) -> None:
        super().__init__()
        self._items: deque[Item] = deque()
        self._reader: asyncio.Future[None] | None = None  # set while `get` waits

    def put_nowait(self, item: Item) -> None:
        self._items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():  # done: woken already, or cancelled
            reader.set_result(None)

    def get_nowait(self) -> Item:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> Item:
        items = self._items
        while not items:
            reader = self._reader = asyncio.get_running_loop().create_future()
            try:
                await reader
            finally:
                self._reader = None
        return items.popleft()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


def prompt_fits(prompt_tokens: int, max_model_len: int) -> bool:
    """vLLM's own rule: a prompt needs room for at least one output token, so a prompt of
    exactly max_model_len tokens does not fit, as vLLM's input processor says. A limit of
    0 is one nobody told (a server that does not say): every prompt is sent, and the
    server's own refusal, if any, is what the user reads."""
    return max_model_len <= 0 or prompt_tokens < max_model_len


def check_prompt_length(prompt_tokens: int, max_model_len: int) -> None:
    """Raise PromptTooLong for a prompt that does not fit (see `prompt_fits`)."""
    if not prompt_fits(prompt_tokens, max_model_len):
        raise PromptTooLong(prompt_tokens, max_model_len)


@dataclass(eq=False)
class RequestTimes:
    """One request's clock: from `stream()` to each token to its end."""

    request_id: str
    submitted_at: float  # when the caller called stream(): TTFT counts from here
    anatomy: AnatomyClock | None = None  # engines that see their scheduler's steps
    token_times: list[float] = field(default_factory=list)  # one per output token

    @classmethod
    def stepped(cls, request_id: str, submitted_at: float) -> RequestTimes:
        """For an engine that steps in this process: its TTFT is booked step by step."""
        return cls(request_id, submitted_at, AnatomyClock(cursor=submitted_at))

    @property
    def tokens(self) -> int:
        return len(self.token_times)

    def token(
        self,
        token_ids: tuple[int, ...],
        text: str,
        *,
        step: int,
        at: float,
        count: int | None = None,
    ) -> TokenEvent:
        """The next output, made at `at`: `count` tokens (one per ID unless said). Tokens
        made together share that one time, so their ITLs after the first are 0."""
        # Once a token per stream, hundreds of streams at once: no list made for one time.
        times = self.token_times
        if times:
            prev = times[-1]
        else:
            prev = self.submitted_at
            if self.anatomy is not None:
                self.anatomy.first_token(at)
        index = len(times)
        n = len(token_ids) if count is None else count
        if n == 1:
            times.append(at)
        else:
            times.extend([at] * n)
        # By position (half the cost of by keyword): request_id, index, token_ids, text,
        # step, time_s, latency_s, TokenEvent's own order (test_client_cpu checks it).
        return TokenEvent(self.request_id, index, token_ids, text, step, at, at - prev)

    def book_step(
        self, started: float, ended: float, own: int, total: int, preempted: bool
    ) -> None:
        """Book one engine step into the TTFT anatomy, until the first token came."""
        if self.anatomy is not None and not self.token_times:
            self.anatomy.step(started, ended, own, total, preempted)

    def lose_output(self, at: float) -> None:
        """Preempted, and the output so far thrown away (the fake recomputes it): the TTFT
        is measured again, to the first token made anew."""
        if self.anatomy is not None and self.token_times:
            self.anatomy.lose_output(at)
        self.token_times.clear()

    def finished(
        self,
        reason: FinishReason,
        now: float,
        *,
        prompt_tokens: int,
        preemptions: int = 0,
        vllm: VllmTimings | None = None,
    ) -> RequestFinished:
        return RequestFinished.from_times(
            self.request_id,
            reason,
            prompt_tokens=prompt_tokens,
            submitted_at=self.submitted_at,
            token_times=self.token_times,
            now=now,
            preemptions=preemptions,
            vllm=vllm,
            # The anatomy explains a first token: none came, nothing to explain.
            anatomy=self.anatomy.result()
            if self.anatomy is not None and self.token_times
            else None,
        )


@dataclass(eq=False)  # live state, compared by identity (`in` a queue is O(1) per item)
class LiveRequest:
    """One request in flight. Engines subclass it for what only they keep per request."""

    request: GenerationRequest
    times: RequestTimes
    prompt_ids: tuple[int, ...] = ()
    # The consumer's loop, for an engine that makes events on a thread of its own.
    loop: asyncio.AbstractEventLoop | None = None
    queue: asyncio.Queue[Item] = field(default_factory=Inbox)
    preemptions: int = 0
    done: bool = False  # its end (RequestFinished or an error) was handed over

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def accepted(self) -> RequestAccepted:
        return RequestAccepted(self.request_id, len(self.prompt_ids), self.times.submitted_at)

    def finished(
        self, reason: FinishReason, now: float, *, vllm: VllmTimings | None = None
    ) -> RequestFinished:
        return self.times.finished(
            reason, now, prompt_tokens=len(self.prompt_ids), preemptions=self.preemptions, vllm=vllm
        )

    def sent(self, item: Item) -> None:
        """Note that `item` is on its way to the consumer: an end makes the request done,
        and its ID free for a new request."""
        if isinstance(item, RequestFinished | BaseException):
            self.done = True

    def put(self, item: Item) -> None:
        """Hand `item` to the consumer; on the consumer's own loop only."""
        self.sent(item)
        self.queue.put_nowait(item)

    def put_threadsafe(self, item: Item) -> None:
        """Hand `item` to the consumer from another thread, on the consumer's loop."""
        assert self.loop is not None
        self.sent(item)
        # A RuntimeError means the consumer's loop is gone: nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


L = TypeVar("L", bound=LiveRequest)


@dataclass(eq=False)
class _Claim(Generic[L]):
    """One open stream of a request ID; `live` once the request was submitted."""

    live: L | None = None

    @property
    def ended(self) -> bool:
        # Its end is on the way: the ID is free, however slowly the consumer reads.
        return self.live is not None and self.live.done


def idle_sample(
    *,
    step: int,
    at: float,
    kv_usage: float,
    free_blocks: int,
    total_blocks: int,
    block_size: int,
    running: int = 0,
    waiting: int = 0,
) -> StepSample:
    """The sample of a pool with no request left (see `RequestBook.went_idle`)."""
    return StepSample(
        step=step,
        started_at=at,
        duration_s=0.0,
        prefill_tokens=0,
        decode_tokens=0,
        running=running,
        waiting=waiting,
        kv_usage=kv_usage,
        free_blocks=free_blocks,
        total_blocks=total_blocks,
        block_size=block_size,
        idle=True,
    )


class RequestBook(Generic[L]):
    """An engine's requests in flight: its open streams and its live requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, _Claim[L]] = {}  # any thread, under the lock
        self._live: dict[str, L] = {}  # the engine's own thread only
        self._idle_sent = True

    # -- the consumer's side: open streams -----------------------------------------------------
    async def stream(
        self, request_id: str, submit: Callable[[], L], abort: Callable[[str], None]
    ) -> AsyncIterator[EngineEvent]:
        """Claim `request_id`, `submit()` the request, and yield its events until
        RequestFinished; an error put on its queue is raised here.

        Raises DuplicateRequestId, before any event, while a request of that ID has not
        ended. A consumer that stops reading before the end (it broke out, or was
        cancelled) aborts the request, so its blocks come back.
        """
        claim: _Claim[L] = _Claim()
        with self._lock:
            other = self._streams.get(request_id)
            if other is not None and not other.ended:
                raise DuplicateRequestId(request_id)
            self._streams[request_id] = claim
        try:
            live = claim.live = submit()
            get = live.queue.get
            while True:
                item = await get()
                if type(item) is TokenEvent:  # most items: neither an end nor an error
                    yield item
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, RequestFinished):
                    return
        finally:
            if claim.live is not None and not claim.live.done:
                abort(request_id)  # the consumer walked away: give the blocks back
            self._release(request_id, claim)

    def _release(self, request_id: str, claim: _Claim[L]) -> None:
        with self._lock:
            if self._streams.get(request_id) is claim:
                del self._streams[request_id]

    def streaming(self, request_id: str) -> L | None:
        """The request whose stream of that ID is open; from any thread."""
        with self._lock:
            claim = self._streams.get(request_id)
        return claim.live if claim is not None else None

    def open_streams(self) -> list[L]:
        """The requests of every open stream that has not ended; from any thread."""
        with self._lock:
            claims = list(self._streams.values())
        return [c.live for c in claims if c.live is not None and not c.live.done]

    # -- the engine's side: live requests (the engine's own thread only) -----------------------
    def add(self, live: L) -> None:
        self._live[live.request_id] = live
        self._idle_sent = False

    def get(self, request_id: str) -> L | None:
        return self._live.get(request_id)

    def __iter__(self) -> Iterator[L]:
        return iter(self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    def finish(
        self, live: L, reason: FinishReason, now: float, *, vllm: VllmTimings | None = None
    ) -> RequestFinished:
        """`live` is over: it leaves the table; returns its RequestFinished to hand over."""
        live.done = True
        if self._live.get(live.request_id) is live:
            del self._live[live.request_id]
        return live.finished(reason, now, vllm=vllm)

    def end_all(self) -> list[L]:
        """Every live request, taken out of the table and marked done: the engine died, and
        hands each its error."""
        ended = list(self._live.values())
        self._live.clear()
        for live in ended:
            live.done = True
        return ended

    def book_step(
        self,
        started: float,
        ended: float,
        own_prefill: Mapping[str, int],
        total_tokens: int,
        preempted: Collection[str],
    ) -> None:
        """Book one step into the TTFT anatomy of every request still before its first
        token, so that the parts add up to its TTFT (see engine/anatomy.py)."""
        for live in self._live.values():
            rid = live.request_id
            live.times.book_step(
                started, ended, own_prefill.get(rid, 0), total_tokens, rid in preempted
            )

    def went_idle(self) -> bool:
        """True once each time the last live request is gone: the engine then sends one
        `idle_sample` of its pool as it is now, so no panel keeps showing the last step."""
        if self._idle_sent or self._live:
            return False
        self._idle_sent = True
        return True
