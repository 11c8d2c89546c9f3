"""GuideLLM's mock server on loopback: an OpenAI-compatible server someone else wrote, with
a set TTFT and ITL, that the GuideLLM project uses as its known-truth target.

The tests (tests/test_any_server.py) and benchmarks/load_truth.py start it. It runs
unmodified from its own venv (.venv-mock, made by scripts/setup.sh), in a process
group of its own that the fixture kills. It is not vLLM: no max_model_len, no /metrics,
no vLLM /tokenize, no token-ID prompts. That is the point.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.loopback_port import free_port

ROOT = Path(__file__).resolve().parents[1]
GUIDELLM = ROOT / ".venv-mock" / "bin" / "guidellm"
START_TIMEOUT_S = 60.0


@dataclass
class MockServer:
    """`guidellm mock-server` with `ttft_ms`, `itl_ms` and any further flags."""

    ttft_ms: float
    itl_ms: float
    flags: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # Its log (an access line per request) goes to a file: a pipe nobody reads would fill.
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix="-mock.log")[1]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MockServer:
        argv = [
            str(GUIDELLM), "mock-server", "--host", "127.0.0.1", "--port", str(self.port),
            "--ttft-ms", str(self.ttft_ms), "--itl-ms", str(self.itl_ms), *self.flags,
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"the mock server exited {self.proc.returncode}: {said}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the mock server did not answer within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self.log.unlink(missing_ok=True)
