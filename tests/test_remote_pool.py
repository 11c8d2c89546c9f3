"""Hundreds of streams at once are all sent at once: the client's pool queues none of them.

A stream queued in the client's connection pool is a request the server never saw, and
its wait would be counted as the server's TTFT (httpx's default pool holds 100
connections). The fake server here sends each reply's first token, then holds every reply
until all the streams have reached it; only then do they end. So every stream has its
first token before any ends, and the server sees them all open at once, if and only if
the client sent them all together: no clock decides it. (A client that queues some waits
for a slot that never frees, until the server's guard gives up and lets the first ones
end: the server then saw fewer at once, and the late ones came after those ended.)

Both transports are checked: the lean one kvscope uses for plain http, and httpx's own,
which https and proxies use.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest
from remote_server import FakeRequest, FakeServer, Reply, head, sse_event

from engine.events import GenerationRequest, RequestFinished, SamplingSettings, TokenEvent
from engine.remote import RemoteEngine
from engine.remote import engine as remote_engine

if TYPE_CHECKING:
    import socket

STREAMS = 160  # past httpx's default pool of 100
GUARD_S = 30.0  # only a client that queues waits this long, and then fails


class HoldUntilAll:
    """A completion route: the first token at once, the rest once `n` streams are open."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived = 0
        self.peak = 0
        self.released_by_guard = 0  # replies the guard let end: a stream was missing
        self._all_here = threading.Condition()

    def __call__(self, req: FakeRequest) -> Reply:
        def write(sock: socket.socket, stop: threading.Event) -> None:
            sock.sendall(head(200, "text/event-stream"))
            token = {"index": 0, "text": "a", "token_ids": [1], "finish_reason": None}
            sock.sendall(sse_event({"choices": [token]}))
            with self._all_here:
                self.arrived += 1
                self.peak = max(self.peak, self.arrived)
                self._all_here.notify_all()
                if not self._all_here.wait_for(lambda: self.arrived >= self.n, GUARD_S):
                    self.released_by_guard += 1
            last = {"index": 0, "text": "b", "token_ids": [2], "finish_reason": "length"}
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            sock.sendall(
                sse_event({"choices": [last]})
                + sse_event({"choices": [], "usage": usage})
                + b"data: [DONE]\n\n"
            )

        return Reply(write)


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_every_stream_gets_its_first_token_before_any_ends(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if transport == "httpx":
        monkeypatch.setattr(remote_engine, "lean_transport_fits", lambda _url: False)
    route = HoldUntilAll(STREAMS)
    with FakeServer({"/v1/completions": route}) as server:
        server._listener.listen(1024)  # every stream connects at once
        engine = RemoteEngine(server.url, kv_events=None)
        engine.start()
        try:
            order = asyncio.run(_all_at_once(engine, STREAMS))
        finally:
            engine.shutdown()
    assert route.released_by_guard == 0, "the server waited for streams the client never sent"
    assert route.peak == STREAMS, f"the server saw at most {route.peak} streams at once"
    firsts = [i for kind, i in order if kind == "first"]
    ends = [i for kind, i in order if kind == "end"]
    assert sorted(firsts) == sorted(ends) == list(range(STREAMS))


async def _all_at_once(engine: RemoteEngine, n: int) -> list[tuple[str, Any]]:
    order: list[tuple[str, Any]] = []

    async def one(i: int) -> None:
        request = GenerationRequest(
            f"pool-{i}",
            prompt_token_ids=(1, 2, 3),
            sampling=SamplingSettings(max_tokens=2, ignore_eos=True),
        )
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent) and event.index == 0:
                order.append(("first", i))
            elif isinstance(event, RequestFinished):
                order.append(("end", i))

    await asyncio.gather(*(one(i) for i in range(n)))
    return order
