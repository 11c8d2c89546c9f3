"""vLLM's own router (`vllm-router`, Rust) on loopback in front of two fake replicas.

What it tells about where a request went: no response header names the worker (it echoes
x-request-id only), but its Prometheus counter per worker does, one request at a time.
Skipped, with the reason, where the router package is not installed (`pip install
kvscope[fleet]`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx
import pytest
from fleet_fakes import MODEL, FakeReplica
from remote_server import free_port

from engine.fleet.attribution import attribute, from_headers, from_router_metrics
from engine.fleet.replicas import parse_replicas

if TYPE_CHECKING:
    from collections.abc import Iterator

START_TIMEOUT_S = 20.0

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm_router") is None,
    reason="vllm-router is not installed (pip install 'kvscope[fleet]')",
)


class Router:
    def __init__(self, workers: list[str], policy: str) -> None:
        self.port, self.prometheus = free_port(), free_port()
        argv = [
            sys.executable, "-m", "vllm_router.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus),
            "--worker-startup-timeout-secs", str(int(START_TIMEOUT_S)),
            "--worker-startup-check-interval", "1", "--log-level", "warning",
        ]  # fmt: skip
        self.http = httpx.Client(timeout=10)
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode()[-2000:] if self.proc.stderr else ""
                pytest.fail(f"vllm-router exited with {self.proc.returncode}: {err}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        pytest.fail(f"vllm-router did not answer /health within {START_TIMEOUT_S:.0f} s")

    def counters(self) -> str:
        return self.http.get(f"http://127.0.0.1:{self.prometheus}/metrics").text

    def stop(self) -> None:
        self.http.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Router, FakeReplica, FakeReplica]]:
    with FakeReplica("a") as a, FakeReplica("b") as b:
        router = Router([a.url, b.url], "round_robin")
        try:
            router.wait_ready()
            yield router, a, b
        finally:
            router.stop()


def _chat(router: Router, n: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": f"hello {n}"}],
    }
    headers = {"x-request-id": f"kvscope-{n}"}
    return router.http.post(router.url + "/v1/chat/completions", json=body, headers=headers)


def test_round_robin_alternates_and_each_request_is_attributed_from_the_router_counter(
    fleet: tuple[Router, FakeReplica, FakeReplica],
) -> None:
    router, a, b = fleet
    replicas = parse_replicas([f"a={a.url}", f"b={b.url}"])
    served: list[str] = []
    for n in range(4):
        before = router.counters()
        reply = _chat(router, n)
        assert reply.status_code == 200
        truth = "a" if "from a" in reply.text else "b"
        header = from_headers(reply.headers, replicas)
        assert header.replica is None  # 0.1.17 names no worker in its answer
        assert reply.headers["x-request-id"] == f"kvscope-{n}"  # echoed, and passed on
        found = attribute(header, from_router_metrics(before, router.counters(), replicas))
        assert (found.replica, found.source) == (truth, "router metrics")
        served.append(truth)
    assert sorted(served) == ["a", "a", "b", "b"]
    assert served[0] != served[1]
    sent = [h for path, h in a.requests + b.requests if path == "/v1/chat/completions"]
    assert {h.get("x-request-id") for h in sent} == {f"kvscope-{n}" for n in range(4)}


def test_the_routers_workers_are_the_replicas(
    fleet: tuple[Router, FakeReplica, FakeReplica],
) -> None:
    router, a, b = fleet
    workers = router.http.get(router.url + "/workers").json()["workers"]
    replicas = parse_replicas([a.url, b.url])
    names = sorted(r.name for w in workers if (r := replicas.at(w["url"])) is not None)
    assert names == ["a", "b"]
    assert all(w["is_healthy"] for w in workers)
