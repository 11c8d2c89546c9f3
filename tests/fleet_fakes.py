"""Made-up fleet data for the fleet tests: /metrics text, KV-event batches, a fake replica.

`FakeReplica` is a pretend vLLM server on 127.0.0.1 (http.server, one thread per
request): /health, /v1/models, /metrics (whatever `metrics` holds now) and a streamed
/v1/chat/completions whose reply names the replica, so a test can see where a router
sent each request. `FakePublisher` is a replica's KV-event PUB socket. No vLLM anywhere.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import msgspec

from engine.remote.kv_event_wire import KvBatch, KvEvent

if TYPE_CHECKING:
    from collections.abc import Callable

MODEL = "fake-model"
BLOCK = 16


def metrics_text(
    *,
    running: int = 0,
    waiting: int = 0,
    usage: float = 0.0,
    prompt: float = 0.0,
    generation: float = 0.0,
    preemptions: float = 0.0,
    queries: float = 0.0,
    hits: float = 0.0,
    engines: int = 1,
) -> str:
    """A vLLM 0.32-shaped /metrics text; each value is split evenly over `engines` ranks."""
    out = [
        "# TYPE vllm:cache_config_info gauge",
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:num_requests_waiting gauge",
        "# TYPE vllm:kv_cache_usage_perc gauge",
    ]
    counters = {
        "vllm:prompt_tokens": prompt,
        "vllm:generation_tokens": generation,
        "vllm:num_preemptions": preemptions,
        "vllm:prefix_cache_queries": queries,
        "vllm:prefix_cache_hits": hits,
    }
    out += [f"# TYPE {name} counter" for name in counters]
    for e in range(engines):
        lab = f'engine="{e}",model_name="{MODEL}"'
        out.append(
            f'vllm:cache_config_info{{{lab},block_size="{BLOCK}",'
            f'num_gpu_blocks="{257 * engines}",enable_prefix_caching="True"}} 1.0'
        )
        out.append(f"vllm:num_requests_running{{{lab}}} {running / engines}")
        out.append(f"vllm:num_requests_waiting{{{lab}}} {waiting / engines}")
        out.append(f"vllm:kv_cache_usage_perc{{{lab}}} {usage}")
        out += [f"{name}_total{{{lab}}} {value / engines}" for name, value in counters.items()]
    return "\n".join(out) + "\n"


def stored(
    hashes: list[int], session: str | None, *, parent: int | None = None, tokens: int = BLOCK
) -> KvEvent:
    """A BlockStored of these block hashes, each `tokens` long."""
    return KvEvent(
        kind="BlockStored",
        block_hashes=tuple(hashes),
        parent_hash=parent,
        num_tokens=tokens * len(hashes),
        block_size=BLOCK,
        session_id=session,
    )


def batch(*events: KvEvent) -> KvBatch:
    return KvBatch(ts=0.0, events=events, rank=0)


def stored_payload(hashes: list[int], session: str | None, rank: int = 0) -> bytes:
    """The msgpack payload vLLM 0.32 sends for one BlockStored (an EventBatch as an array)."""
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(BLOCK * len(hashes))),
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "session_id": session,
    }
    return msgspec.msgpack.encode([1.0, [event], rank])


class FakeReplica:
    """A pretend vLLM server; `requests` holds (path, headers) of every request, in order."""

    def __init__(self, name: str, metrics: str | None = None) -> None:
        self.name = name
        self.metrics = metrics if metrics is not None else metrics_text()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.kv_sources: dict[str, Any] | None = None  # GET /kv_event_sources, else 404
        self.stopped = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: the test output is for the test

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _gone(self) -> bool:
                # A kept-alive connection outlives the listener: a stopped replica
                # answers nothing on it either, as a killed server would.
                if fake.stopped:
                    self.close_connection = True
                return fake.stopped

            def do_GET(self) -> None:
                if self._gone():
                    return
                fake.requests.append((self.path, dict(self.headers)))
                if self.path == "/health":
                    self._send(200, "text/plain", b"")
                elif self.path == "/metrics":
                    self._send(200, "text/plain", fake.metrics.encode())
                elif self.path == "/kv_event_sources" and fake.kv_sources is not None:
                    self._send(200, "application/json", json.dumps(fake.kv_sources).encode())
                elif self.path == "/v1/models":
                    entry = {"id": MODEL, "root": MODEL, "max_model_len": 1024}
                    self._send(200, "application/json", json.dumps({"data": [entry]}).encode())
                else:
                    self._send(404, "application/json", b'{"detail": "Not Found"}')

            def do_POST(self) -> None:
                if self._gone():
                    return
                fake.requests.append((self.path, dict(self.headers)))
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                if self.path == "/tokenize":  # vLLM's: any chat is a few token IDs
                    tokens = {"tokens": [1, 2, 3], "count": 3, "max_model_len": 1024}
                    self._send(200, "application/json", json.dumps(tokens).encode())
                    return
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    self._send(404, "application/json", b'{"detail": "Not Found"}')
                    return
                chunk = {"choices": [{"index": 0, "delta": {"content": f"from {fake.name}"}}]}
                body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                self._send(200, "text/event-stream", body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def stop(self) -> None:
        self.stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeReplica:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class FakePublisher:
    """A replica's KV-event PUB socket on loopback, framed as vLLM 0.32 frames it
    (topic, 8-byte sequence number, payload); no replay endpoint."""

    def __init__(self) -> None:
        import zmq
        from remote_server import free_port

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self.port = free_port()
        self._pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.seq = 0
        self._lock = threading.Lock()

    def sources(self) -> dict[str, Any]:
        """What the replica's GET /kv_event_sources answers: a wildcard endpoint."""
        return {
            "0": {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{self.port}",
                "replay_endpoint": None,
            }
        }

    def send(self, payload: bytes) -> None:
        with self._lock:
            self._pub.send_multipart([b"kv", self.seq.to_bytes(8, "big"), payload])
            self.seq += 1

    def send_raw(self, *frames: bytes) -> None:
        self._pub.send_multipart(list(frames))

    def warm(self, received: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Send empty batches until the subscriber has one: ZMQ drops what a PUB sends
        before a SUB has joined (the slow joiner)."""
        deadline = time.monotonic() + timeout_s
        while not received():
            if time.monotonic() > deadline:
                raise TimeoutError("the subscriber never joined")
            self.send(msgspec.msgpack.encode([0.0, [], 0]))
            time.sleep(0.05)

    def close(self) -> None:
        self._pub.close(linger=0)
        self._ctx.term()
