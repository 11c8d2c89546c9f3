"""A hostile OpenAI-compatible server on loopback, for the load tests under failures.

It is tests/remote_server.py's `FakeServer` (one thread per connection, `Connection:
close`, vLLM's /v1/models, /tokenize and /metrics) with completion routes that misbehave
on purpose, as servers do under load:

- `fail_after(n)`: the first `n` replies stream; every later one is an HTTP error (500);
- `cut(tokens)`: each reply streams `tokens` tokens, then the connection closes mid-event;
- `stall(tokens)`: each reply streams `tokens` tokens, then nothing, until the timeout;
- `die_after(n)`: a replica that dies: after `n` replies it stops listening (new
  connections are refused) and drops every stream it still holds.

Both /v1/completions and /v1/chat/completions stream SSE, so a client of either API (vLLM
token IDs or a client-side tokenizer) meets the same faults. No vLLM anywhere; it starts
in milliseconds, in a thread of the test's own process.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Literal

from remote_server import (
    FakeServer,
    Reply,
    chat_chunk,
    head,
    json_reply,
    sse_event,
)

if TYPE_CHECKING:
    import socket

    from remote_server import FakeRequest, Route

Mode = Literal["fail_after", "cut", "stall", "die_after"]
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
TOKEN_GAP_S = 0.002  # between streamed tokens: a reply is a stream, not one write


def _chunks(count: int) -> list[bytes]:
    return [chat_chunk(f" t{i}", token_ids=[100 + i]) for i in range(count)]


def _whole(max_tokens: int) -> list[bytes]:
    """A whole streamed reply of `max_tokens` tokens, its usage, and [DONE]."""
    parts = _chunks(max_tokens)
    parts.append(chat_chunk("", token_ids=[], finish="length"))
    usage = {"prompt_tokens": 7, "completion_tokens": max_tokens}
    parts.append(sse_event({"choices": [], "usage": {**usage, "total_tokens": 7 + max_tokens}}))
    parts.append(b"data: [DONE]\n\n")
    return parts


class HostileServer(FakeServer):
    """A `FakeServer` whose completion routes fail as `mode` says (see the module)."""

    def __init__(self, mode: Mode, n: int = 0, *, status: int = 500) -> None:
        self.mode, self.n, self.status = mode, n, status
        self.served = 0  # completion requests seen, in order of arrival
        self.failed = 0  # of those, the ones this server made fail
        self.dead = threading.Event()
        self._count = threading.Lock()
        route: Route = self._completion
        super().__init__(dict.fromkeys(COMPLETIONS, route))

    def _completion(self, req: FakeRequest) -> Reply:
        body = req.json() or {}
        max_tokens = int(body.get("max_tokens") or 4)
        with self._count:
            self.served += 1
            index = self.served
        if self.mode == "fail_after" and index > self.n:
            self.failed += 1
            detail = {"object": "error", "message": "the hostile server fails on purpose"}
            return json_reply({**detail, "type": "InternalServerError"}, self.status)
        if self.mode == "die_after" and index > self.n:
            self.failed += 1
            self._die()
            return Reply(lambda _sock, _stop: None)  # closed with nothing said
        if self.mode in ("cut", "stall"):
            self.failed += 1
            return self._broken(min(self.n, max_tokens))
        return self._streamed(_whole(max_tokens))

    def _streamed(self, parts: list[bytes]) -> Reply:
        def write(sock: socket.socket, stop: threading.Event) -> None:
            sock.sendall(head(200, "text/event-stream"))
            for part in parts:
                # A dying replica drops the streams it holds, as a killed process does.
                if self.dead.is_set() or stop.wait(TOKEN_GAP_S):
                    return
                sock.sendall(part)

        return Reply(write)

    def _broken(self, tokens: int) -> Reply:
        def write(sock: socket.socket, stop: threading.Event) -> None:
            sock.sendall(head(200, "text/event-stream"))
            for part in _chunks(tokens):
                if stop.wait(TOKEN_GAP_S):
                    return
                sock.sendall(part)
            if self.mode == "stall":
                stop.wait()  # the stream stays open and says nothing more
                return
            # Cut mid-event: half an SSE line, then the socket closes (on return).
            sock.sendall(b'data: {"choices": [{"index": 0, "delta": {"content"')

        return Reply(write)

    def _die(self) -> None:
        """Stop listening: connections from now on are refused, as to a killed process."""
        if self.dead.is_set():
            return
        self.dead.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> HostileServer:
        return self
