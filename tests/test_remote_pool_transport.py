"""The lean transport's HTTP/1.1 reading (engine/remote/transport.py), byte by byte.

No clock and mostly no network: answers are fed to a connection in every possible split,
as reads of a loaded host would cut them, and must give the same body and the same end.
The last tests go over loopback to a fake server: a kept-alive connection is used again,
and a server that closes mid-reply is an httpx error the engine already words.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx
import pytest
from remote_server import FakeServer, raw, sse, sse_event

from engine.remote.transport import LeanTransport, _Connection, lean_transport_fits

EVENTS = [sse_event({"choices": [{"text": t, "token_ids": [i]}]}) for i, t in enumerate("abc")]
BODY = b"".join(EVENTS) + b"data: [DONE]\n\n"


def chunked(*parts: bytes) -> bytes:
    frames = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)
    return frames + b"0\r\nX-Trailer: 1\r\n\r\n"


CHUNKED = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + chunked(*EVENTS, b"data: [DONE]\n\n")
)
LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY


def feed(conn: _Connection, data: bytes, cuts: tuple[int, ...]) -> bytes:
    body = b""
    edges = (0, *cuts, len(data))
    for a, b in itertools.pairwise(edges):
        conn.data_received(data[a:b])
        body += conn.take() if conn.body else b""
    return body


@pytest.mark.parametrize("answer", [CHUNKED, LENGTH], ids=["chunked", "length"])
def test_every_split_gives_the_same_body_and_end(answer: bytes) -> None:
    for cut in range(1, len(answer)):
        for second in (cut + 1, cut + 7, len(answer) - 1):
            cuts = (cut,) if second <= cut or second >= len(answer) else (cut, second)
            conn = _Connection(("h", 1))
            assert feed(conn, answer, cuts) == BODY, cuts
            assert conn.status == 200 and conn.complete and conn.error is None, cuts
            assert conn.keep_alive, cuts


def test_a_body_that_ends_with_the_connection_is_not_kept() -> None:
    conn = _Connection(("h", 1))
    assert feed(conn, CLOSE, (40,)) == BODY
    assert not conn.complete
    conn.eof_received()
    assert conn.complete and not conn.keep_alive


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "CRLF"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "not a number"),
    ],
)
def test_a_garbled_answer_is_a_protocol_error(answer: bytes, says: str) -> None:
    conn = _Connection(("h", 1))
    conn.data_received(answer)
    assert isinstance(conn.error, httpx.RemoteProtocolError)
    assert says in str(conn.error)


def test_https_and_proxies_keep_httpx_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert lean_transport_fits("http://127.0.0.1:8000")
    assert not lean_transport_fits("https://gpu-box:8000")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert not lean_transport_fits("http://127.0.0.1:8000")


async def _get_twice(url: str) -> tuple[list[Any], int]:
    transport = LeanTransport()
    async with httpx.AsyncClient(base_url=url, transport=transport) as client:
        answers = []
        for _ in range(2):
            r = await client.get("/v1/models")
            answers.append(r.json())
    return answers, transport.connections_made


def test_a_kept_alive_connection_serves_the_next_request() -> None:
    body = json.dumps({"data": []}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    # The fake server serves one request a connection: a second one on the same
    # connection finds it closed, and the transport retries once on a new one.
    with FakeServer({"/v1/models": lambda _r: raw(answer)}) as server:
        answers, made = asyncio.run(_get_twice(server.url))
    assert answers == [{"data": []}, {"data": []}]
    assert made == 2


async def _stream(url: str) -> bytes:
    async with (
        httpx.AsyncClient(base_url=url, transport=LeanTransport()) as client,
        client.stream("POST", "/v1/completions", json={}) as response,
    ):
        got = b""
        async for data in response.aiter_raw():
            got += data
        return got


def test_a_reply_cut_short_is_an_httpx_error() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with (
        FakeServer({"/v1/completions": lambda _r: raw(head + b"5\r\nab")}) as server,
        pytest.raises(httpx.RemoteProtocolError, match="complete message body"),
    ):
        asyncio.run(_stream(server.url))
    with FakeServer({"/v1/completions": lambda _r: sse(EVENTS[0])}) as server:
        assert asyncio.run(_stream(server.url)) == EVENTS[0]  # close-delimited: complete
