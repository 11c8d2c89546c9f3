"""A real vLLM CPU server frozen with SIGSTOP, before a request and in the middle of one:
the attached engine says which wait ran out and after how long, keeps the tokens it had,
and works again once the server is let go (SIGCONT). The fake-server cases of the same
timeouts are in tests/test_bad_input_attach.py; this is the one that needs the real thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING

import pytest
from remote_server import API_KEY

from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    TokenEvent,
)
from engine.remote import RemoteEngine
from engine.remote.timeouts import ServerStalled, Timeouts

if TYPE_CHECKING:
    from collections.abc import Iterator

    from remote_server import VllmServer

pytestmark = pytest.mark.engine


@contextlib.contextmanager
def frozen(server: VllmServer) -> Iterator[None]:
    """The server's whole process group stopped, and always let go again."""
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)


async def served_all(engine: RemoteEngine, timeout_s: float = 120) -> None:
    """Wait for a scrape, taken from now on, in which the server runs and queues nothing:
    what it was sent while frozen has been served (or dropped). A state waited for, not a
    sleep sized on one machine."""
    since = time.perf_counter()
    deadline = since + timeout_s
    while True:
        last = engine.last_scrape
        if last is not None and last.time_s > since and last.running == last.waiting == 0:
            return
        assert time.perf_counter() < deadline, f"the server still busy after {timeout_s} s: {last}"
        await asyncio.sleep(0.05)


def chat(request_id: str, tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        request_id,
        messages=(ChatMessage("user", "Count from one to twenty."),),
        sampling=SamplingSettings(tokens, ignore_eos=True),
    )


# The reply frozen in its middle must still be decoding when the freeze lands, one event
# after its first token. Eight tokens were not enough on a fast CPU (CI: the whole reply
# was already in the socket's buffer, and the stream ended without a stall); the server
# drops the rest once it is thawed and finds the client gone.
LONG_REPLY = 256


async def test_a_frozen_server_is_named_at_once_and_works_once_thawed(
    vllm_server: VllmServer,
) -> None:
    limits = Timeouts(5, 0.5, 0.5)
    engine = RemoteEngine(vllm_server.url, api_key=API_KEY, kv_events=None, timeouts=limits)
    engine.start()
    try:
        with frozen(vllm_server):
            began = time.perf_counter()
            with pytest.raises(ServerStalled) as before:
                async for _ in engine.stream(chat("frozen-before")):
                    pass
            took = time.perf_counter() - began
        assert before.value.wait == "first byte"
        # Named by the first-byte limit, before the connect limit could have been the one.
        assert took < limits.connect_s, f"{took:.1f} s for a {limits.first_byte_s} s limit"
        assert "sent nothing for 0.5 s after the request" in before.value.plain()
        # What the frozen server was sent is still in its queue: let it be served.
        await served_all(engine)

        # A loaded 2-core box may take seconds to the first token once thawed, and some
        # hundred ms between two: the first byte may take its time now, not a gap.
        engine.timeouts = Timeouts(5, 60, 2)
        tokens: list[EngineEvent] = []
        stop = contextlib.ExitStack()
        during: ServerStalled | None = None
        try:
            async for event in engine.stream(chat("frozen-during", LONG_REPLY)):
                if isinstance(event, TokenEvent):
                    tokens.append(event)
                    if len(tokens) == 1:
                        stop.enter_context(frozen(vllm_server))
        except ServerStalled as stalled:
            during = stalled
        finally:
            stop.close()
        assert during is not None, (
            f"the reply ended without a stall: {len(tokens)} token events, the server frozen "
            f"after the first of {LONG_REPLY}"
        )
        assert during.wait == "between chunks"
        assert during.tokens_received == sum(
            len(t.token_ids) for t in tokens if isinstance(t, TokenEvent)
        )
        assert "the reply so far is kept" in during.plain().lower()

        await served_all(engine)  # thawed: the next request is served whole
        # With the default limits: the 2 s gap above was for telling a frozen server
        # quickly, and a thawed one on a host busier than its cores took longer once
        # (fresh clone AD, three workers: "nothing for 2 s after 1 token").
        engine.timeouts = Timeouts()
        events = [e async for e in engine.stream(chat("thawed"))]
        assert isinstance(events[-1], RequestFinished)
        assert events[-1].output_tokens == 8
    finally:
        engine.shutdown()
