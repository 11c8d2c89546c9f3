"""A fake OpenAI-compatible server whose replies keep set timings, for load_truth.py.

It answers the calls kvscope makes to attach (`/v1/models`, `/metrics`, `/tokenize`) and
streams every completion the way vLLM's server (uvicorn) does: HTTP/1.1 keep-alive,
chunked transfer encoding, one SSE event per chunk. Each reply's first token leaves
`ttft_s` after its request was read, then one token every `itl_s`, each due time counted
from the request (not accumulated sleeps, so one late write does not shift the rest).

It runs in a process of its own (`python benchmarks/timed_server.py`), on one asyncio
loop with no thread per connection, so the client under test shares no interpreter lock
with it, and both kvscope and `vllm bench serve` meet the very same server.

`stats` keeps how late the server itself sent each token against its due time: when
that lateness is small, a client's error is the client's own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"
MAX_MODEL_LEN = 4096
# Enough of vLLM's /metrics for kvscope to attach and size the KV pool.
METRICS = f"""\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="65536",\
enable_prefix_caching="True",engine="0"}} 1.0
"""


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(pct / 100 * len(ordered)))]


@dataclass
class Lateness:
    """How late the server sent its tokens against their due times, and the TTFT and
    ITL it actually kept (seconds): a client's error is the distance to these."""

    sent: int = 0
    total_s: float = 0.0
    worst_s: float = 0.0
    over_1ms: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)

    def add(self, late_s: float) -> None:
        self.sent += 1
        self.total_s += late_s
        self.worst_s = max(self.worst_s, late_s)
        self.over_1ms += late_s > 1e-3

    def take(self) -> dict[str, float]:
        out = {
            "tokens": float(self.sent),
            "mean_late_ms": self.total_s / self.sent * 1e3 if self.sent else 0.0,
            "worst_late_ms": self.worst_s * 1e3,
            "over_1ms": float(self.over_1ms),
        }
        for name, values in (("ttft", self.ttft_s), ("itl", self.itl_s)):
            out[f"mean_{name}_ms"] = sum(values) / len(values) * 1e3 if values else 0.0
            out[f"median_{name}_ms"] = _pct(values, 50) * 1e3
            out[f"p99_{name}_ms"] = _pct(values, 99) * 1e3
        self.sent, self.total_s, self.worst_s, self.over_1ms = 0, 0.0, 0.0, 0
        self.ttft_s, self.itl_s = [], []
        return out


@dataclass
class TimedServer:
    ttft_s: float
    itl_s: float
    late: Lateness = field(default_factory=Lateness)
    connections: int = 0
    peak_streams: int = 0
    streams: int = 0
    # At most this many streams at once (0: no limit); the rest wait for a slot, as
    # requests wait for vLLM's --max-num-seqs, and their schedule starts when they get one.
    max_streams: int = 0
    slots: asyncio.Semaphore | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # One write is one token: Nagle would merge tokens the client must see apart.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                method, path, body = request
                if path.startswith("/v1/completions") or path.startswith("/v1/chat/completions"):
                    if self.max_streams and self.slots is None:
                        self.slots = asyncio.Semaphore(self.max_streams)  # in the running loop
                    if self.slots is None:
                        await self._complete(writer, body, chat="chat" in path)
                    else:
                        async with self.slots:
                            await self._complete(writer, body, chat="chat" in path)
                else:
                    writer.write(self._answer(method, path, body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    def _answer(self, method: str, path: str, body: bytes) -> bytes:
        if path == "/v1/models":
            entry = {"id": MODEL, "root": MODEL, "max_model_len": MAX_MODEL_LEN}
            return _whole(200, "application/json", json.dumps({"data": [entry]}))
        if path == "/metrics":
            return _whole(200, "text/plain", METRICS)
        if path == "/tokenize" and method == "POST":
            data = json.loads(body or b"{}")
            text = str(data.get("prompt") or json.dumps(data.get("messages")))
            tokens = [1000 + (ord(c) % 500) for c in text]
            return _whole(200, "application/json", json.dumps({"tokens": tokens}))
        if path == "/stats":
            return _whole(200, "application/json", json.dumps(self._stats()))
        return _whole(404, "application/json", '{"detail": "Not Found"}')

    def _stats(self) -> dict[str, float]:
        out = self.late.take()
        out["connections"] = float(self.connections)
        out["peak_streams"] = float(self.peak_streams)
        self.peak_streams = 0
        return out

    async def _complete(self, writer: asyncio.StreamWriter, body: bytes, *, chat: bool) -> None:
        start = time.perf_counter()
        data = json.loads(body or b"{}")
        n = int(data.get("max_tokens") or data.get("max_completion_tokens") or 16)
        prompt = data.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt)) // 4
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        self.streams += 1
        last = start
        self.peak_streams = max(self.peak_streams, self.streams)
        try:
            for i in range(n):
                due = start + self.ttft_s + i * self.itl_s
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                choice: dict[str, Any] = {"index": 0, "finish_reason": None, "token_ids": [i]}
                if chat:
                    choice["delta"] = {"content": "x"}
                else:
                    choice["text"] = "x"
                if i == n - 1:
                    choice["finish_reason"] = "length"
                writer.write(_chunk(_event({"choices": [choice]})))
                now = time.perf_counter()
                self.late.add(max(now - due, 0.0))
                if i == 0:
                    self.late.ttft_s.append(now - start)
                else:
                    self.late.itl_s.append(now - last)
                last = now
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            }
            writer.write(_chunk(_event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n"))
            writer.write(b"0\r\n\r\n")
        finally:
            self.streams -= 1


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _whole(status: int, content_type: str, text: str) -> bytes:
    body = text.encode()
    head = f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    try:
        top = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    first, *lines = top.decode("latin-1").split("\r\n")
    method, path, _version = first.split(" ", 2)
    length = 0
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return method, path.split("?")[0], body


async def main_async(args: argparse.Namespace) -> None:
    server = TimedServer(args.ttft_ms / 1e3, args.itl_ms / 1e3, max_streams=args.max_streams)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", args.port, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    print(port, flush=True)  # the parent reads the port from the first line
    async with listener:
        await listener.serve_forever()


def main() -> int:
    # Ahead of the host's other work where allowed (root): the server's schedule is the
    # truth both clients are measured against, and it should not be what runs late.
    with contextlib.suppress(OSError):
        os.nice(-10)
    with contextlib.suppress(ImportError):
        import uvloop  # vLLM's own server runs on it; so does this one where it is

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--itl-ms", type=float, default=40.0)
    ap.add_argument("--max-streams", type=int, default=0, help="streams at once (0: no limit)")
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
