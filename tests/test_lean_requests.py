"""Streams POSTed without httpx's client per request (engine/remote/transport.py's
LeanPoster): the same bytes on the wire as httpx.AsyncClient sends, the same answers,
cookies kept as httpx's client keeps them, httpx's error types; and the remote engine
uses it for plain http only.

A tiny asyncio server in the test records every request's bytes and answers from a list.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.remote.transport import LeanAnswer, LeanPoster, LeanTransport

ROOT = Path(__file__).resolve().parents[1]

EVENTS = (
    b"".join(
        b"data: " + json.dumps({"choices": [{"text": t, "token_ids": [i]}]}).encode() + b"\n\n"
        for i, t in enumerate("abc")
    )
    + b"data: [DONE]\n\n"
)


def chunked(body: bytes, *, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + extra
    events = [p + b"\n\n" for p in body.split(b"\n\n") if p]  # one chunk an event
    frames = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in events)
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + frames + b"0\r\n\r\n"


class Recorder:
    """Serves HTTP/1.1 with keep-alive: each request's bytes kept, `answers` sent in turn."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Recorder:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.requests.append(head + await reader.readexactly(length))
                writer.write(self.answers.pop(0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def client(url: str) -> tuple[httpx.AsyncClient, LeanTransport]:
    transport = LeanTransport()
    http = httpx.AsyncClient(
        base_url=url + "/base",
        headers={"Authorization": "Bearer k-1"},
        timeout=httpx.Timeout(connect=5.0, read=None, write=5.0, pool=5.0),
        transport=transport,
    )
    return http, transport


BODY: dict[str, Any] = {"model": "m", "prompt": [1, 2, 3], "stream": True, "x": "é ☃"}


async def _both_ways() -> tuple[list[bytes], list[bytes], int]:
    async with Recorder([chunked(EVENTS)] * 4) as server:
        http, transport = client(server.url)
        poster = LeanPoster(http, transport)
        got = []
        for _ in range(2):
            async with poster.post("/v1/completions", BODY) as answer:
                assert answer.status_code == 200
                assert answer.headers["content-type"] == "text/event-stream"
                got.append(b"".join([raw async for raw in answer.aiter_raw()]))
        for _ in range(2):
            async with http.stream("POST", "/v1/completions", json=BODY) as response:
                got.append(b"".join([raw async for raw in response.aiter_raw()]))
        await http.aclose()
        return server.requests, got, transport.connections_made


def test_the_bytes_sent_are_httpx_clients_own_and_the_connection_is_kept() -> None:
    requests, bodies, made = asyncio.run(_both_ways())
    lean, by_httpx = requests[:2], requests[2:]
    assert lean == by_httpx  # request line, base path, headers (auth too), JSON body
    assert lean[0].startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer k-1\r\n" in lean[0]
    assert bodies == [EVENTS] * 4
    assert made == 1  # one kept-alive connection for all four


async def _cookies() -> list[bytes]:
    answers = [
        chunked(EVENTS, extra=b"Set-Cookie: lb=replica-2; Path=/\r\n"),
        chunked(EVENTS),
        chunked(EVENTS),
    ]
    async with Recorder(answers) as server:
        http, transport = client(server.url)
        poster = LeanPoster(http, transport)
        for _ in range(2):
            async with poster.post("/v1/completions", BODY) as answer:
                async for _raw in answer.aiter_raw():
                    pass
        async with http.stream("POST", "/v1/completions", json=BODY) as response:
            await response.aread()
        await http.aclose()
        return server.requests


def test_a_cookie_the_server_sets_is_sent_back_as_httpx_client_does() -> None:
    first, second, by_httpx = asyncio.run(_cookies())
    assert b"cookie" not in first.lower()
    assert b"Cookie: lb=replica-2\r\n" in second
    assert second == by_httpx


async def _refused_answer() -> tuple[LeanAnswer, bytes]:
    body = b'{"error": {"message": "no such model"}}'
    answer = (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
        b"Location: /elsewhere\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with Recorder([answer]) as server:
        http, transport = client(server.url)
        async with LeanPoster(http, transport).post("/v1/completions", BODY) as got:
            content = await got.aread()
        await http.aclose()
        return got, content


def test_an_error_answer_reads_as_httpx_response_does() -> None:
    got, content = asyncio.run(_refused_answer())
    assert got.status_code == 404
    assert got.headers.get("location") == "/elsewhere"
    assert json.loads(content)["error"]["message"] == "no such model"


async def _cut_short() -> None:
    # The server sends part of a chunk and, having no more answers, closes.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
    async with Recorder([head]) as server:
        http, transport = client(server.url)
        try:
            async with LeanPoster(http, transport).post("/v1/completions", BODY) as got:
                async for _raw in got.aiter_raw():
                    pass
        finally:
            await http.aclose()


def test_a_reply_cut_short_and_a_refused_connection_are_httpx_errors() -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
        asyncio.run(_cut_short())

    async def refused() -> None:
        http, transport = client("http://127.0.0.1:1")
        try:
            async with LeanPoster(http, transport).post("/v1/completions", BODY):
                pass
        finally:
            await http.aclose()

    with pytest.raises(httpx.ConnectError, match="Connection refused"):
        asyncio.run(refused())


def test_the_remote_engine_streams_through_it_for_plain_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The load runner through RemoteEngine against benchmarks/timed_server.py: every
    request completes with all its tokens, each sent through the poster, and its token
    times are where the server's pacing and the point's length put them."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.load_truth import ServerProcess, kvscope_round

    posted: list[str] = []
    post = LeanPoster.post

    def spy(self: LeanPoster, path: str, body: Any) -> Any:
        posted.append(path)
        return post(self, path, body)

    monkeypatch.setattr(LeanPoster, "post", spy)
    ttft_ms, itl_ms, output, prompts = 20.0, 5.0, 8, 8
    server = ServerProcess(ttft_ms=ttft_ms, itl_ms=itl_ms)
    try:
        figures = kvscope_round(server.url, users=4, output=output, prompts=prompts)
    finally:
        server.stop()
    assert isinstance(figures, dict), figures  # all 8 completed, with their 8 tokens
    assert posted == ["/v1/completions"] * prompts
    # The token times, checked by bounds that hold on any host, however loaded. A
    # per-gap bound does not: on a busy host several tokens come in one read, share its
    # time, and their gaps read 0 (a median ITL of 3.2 ms was seen for a 5 ms server).
    # Merged reads move time between a request's gaps and its TTFT, not out of their
    # sum: TTFT + the request's ITLs is its last token's arrival, counted from stream().
    # Each request has `output` tokens, so the mean of that sum over requests is:
    last_token_ms = figures["mean_ttft_ms"] + (output - 1) * figures["mean_itl_ms"]
    # No earlier than the server's pacing: the server starts a reply's clock after
    # stream() sent the request and writes token i no earlier than TTFT + i ITLs from
    # there, less what its timer can fire early (uvloop, which it runs on where
    # installed, rounds a sleep to whole milliseconds on a millisecond clock that may
    # lag by a tick of its own: under 3 ms in all).
    paced_ms = ttft_ms + (output - 1) * itl_ms - 3.0
    # No later than the point's end: every token came before the last request ended.
    duration_ms = prompts * output / figures["output_throughput"] * 1e3
    assert paced_ms <= last_token_ms <= duration_ms + 1e-6, figures
