"""How a load point sends: N users in a closed loop, or a schedule in an open loop.

A closed loop's users each send their next request when their last one ends; an open
loop sends on a seeded schedule (`bench.arrivals`) whatever the replies do, and keeps
each request's planned send time beside its actual one. An open-loop point at a finite
rate that the engine cannot keep up with stops early (`bench.saturation`) and says why.
What the sends measured is summed up by `bench.load_runner`; times are on the engine's
clock.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.saturation import SaturationWatch
from engine.errors import (
    ConnectionLost,
    EngineDied,
    KvscopeError,
    RequestRejected,
    ServerUnreachable,
)
from engine.events import GenerationRequest, RequestFinished, TokenEvent
from engine.remote.timeouts import ServerStalled

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.load_prompts import PromptMaker
    from engine.clock import Clock
    from engine.protocol import Engine


_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")


def failure_cause(exc: KvscopeError) -> str:
    """What broke a request, in the words a load result counts failures by: "HTTP 500",
    "cut" (the stream broke), "timeout" (a --timeout limit ran out), "replica down" (no
    server answered), "engine died", else "refused" (the engine said no)."""
    if isinstance(exc, ServerStalled):  # before ServerUnreachable: it is one
        return "timeout"
    if isinstance(exc, ConnectionLost):
        return "cut"
    if isinstance(exc, ServerUnreachable):
        return "replica down"
    if isinstance(exc, EngineDied):
        return "engine died"
    if isinstance(exc, RequestRejected):
        # The server's status is only in the words (engine/remote writes "HTTP 500: ...").
        status = _HTTP_STATUS.search(exc.reason)
        if status:
            return f"HTTP {status.group(1)}"
    return "refused"


@dataclass(eq=False)
class SentRequest:
    """One request of a point: when it was planned and sent, and how it ended.

    A request that fails keeps what it got before it failed (`tokens`, `first_token_s`,
    `token_s`) and when (`failed_s`), so a result can show the partial reply.
    """

    request: GenerationRequest
    planned_s: float | None
    sent_s: float = 0.0
    user: int | None = None
    finished: RequestFinished | None = None
    error: str | None = None
    cause: str | None = None  # failure_cause() of the error
    tokens: int = 0  # output tokens received, finished or not
    token_s: list[float] = field(default_factory=list)  # each token event, from the send
    failed_s: float | None = None  # from the send to the failure


class PointInFlight:
    """One point in flight: its sends, its watch, and when to stop."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        rate: float | None,
        tick: Callable[[PointInFlight], None],
    ) -> None:
        self.engine, self.clock = engine, clock
        self.tick = tick
        self.start = clock.now()
        self.sent: list[SentRequest] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.done = 0
        self.in_flight = 0
        self.peak = 0
        self.stop_reason: str | None = None
        self.stopped = asyncio.Event()
        # Only a finite open loop can over-saturate: closed-loop users wait for their
        # replies, and a rate of inf sends everything at once.
        checked = rate is not None and math.isfinite(rate)
        self.watch = SaturationWatch() if checked else None
        self.planned: int | None = None
        self.duration_s: float | None = None
        self.ended_s: float | None = None  # set by `end()`, once the last reply is in

    def elapsed(self) -> float:
        return self.clock.now() - self.start

    def end(self) -> None:
        """The point's load is over: what comes after (the last scrape windows) is not
        part of its duration, as `vllm bench serve` stops its clock when its requests end."""
        self.ended_s = self.elapsed()

    def length(self) -> float:
        """From the first send to `end()` (to now, before it)."""
        return self.ended_s if self.ended_s is not None else self.elapsed()

    async def send(self, s: SentRequest) -> None:
        s.sent_s = self.clock.now() - self.start
        self.sent.append(s)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.watch is not None:
            self.watch.sent(s.sent_s)
        self.tick(self)
        try:
            async for event in self.engine.stream(s.request):
                if isinstance(event, TokenEvent):
                    since_send = event.time_s - self.start - s.sent_s
                    s.tokens += len(event.token_ids)
                    s.token_s.append(since_send)
                    if event.index == 0 and self.watch:
                        self.watch.first_token(s.sent_s, since_send)
                elif isinstance(event, RequestFinished):
                    s.finished = event
        except KvscopeError as exc:
            s.error, s.cause = exc.plain(), failure_cause(exc)
            s.failed_s = self.elapsed() - s.sent_s
        finally:
            self.in_flight -= 1
            self.done += 1
            if self.watch is not None:
                self.watch.ended(self.elapsed(), failed=s.error is not None)
        self._check()
        self.tick(self)

    def spawn(self, s: SentRequest) -> None:
        task = asyncio.get_running_loop().create_task(self.send(s))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _check(self) -> None:
        if self.watch is None or self.stop_reason is not None:
            return
        reason = self.watch.verdict(self.elapsed())
        if reason is not None:
            self.stop_reason = reason
            self.stopped.set()

    async def sleep_until(self, t: float) -> bool:
        """Sleep to `t` s from the start in short steps; False if the point stopped."""
        while not self.stopped.is_set():
            left = self.start + t - self.clock.now()
            if left <= 0:
                return True
            await self.clock.sleep(min(left, 0.25))
            self._check()
        return False


async def open_loop(p: PointInFlight, requests: list[GenerationRequest], plan: list[float]) -> None:
    for request, t in zip(requests, plan, strict=True):
        if not await p.sleep_until(t):
            break
        p.spawn(SentRequest(request, planned_s=t))
    await _drain(p)


async def closed_loop(
    p: PointInFlight,
    users: int,
    ready: list[GenerationRequest],
    count: int | None,
    maker: PromptMaker,
    duration_s: float | None,
) -> None:
    order = itertools.count()

    async def user(u: int) -> None:
        while not p.stopped.is_set():
            if duration_s is not None and p.elapsed() >= duration_s:
                return
            i = next(order)
            if count is not None and i >= count:
                return
            request = ready[i] if i < len(ready) else maker.make(i)
            await p.send(SentRequest(request, planned_s=None, user=u))

    await asyncio.gather(*(user(u) for u in range(users)))


async def _drain(p: PointInFlight) -> None:
    """Wait for the replies in flight; on an early stop, abort them instead."""
    while p.tasks:
        waiter = asyncio.ensure_future(p.stopped.wait())
        await asyncio.wait({*p.tasks, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if p.stopped.is_set():
            for task in list(p.tasks):
                task.cancel()  # the stream's consumer walks away: the engine aborts it
            await asyncio.gather(*p.tasks, return_exceptions=True)
        waiter.cancel()
