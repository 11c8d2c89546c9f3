"""A real fleet on loopback for the fleet tests: two small CPU vLLM servers with KV events,
and vLLM's router (`vllm-router`, round robin) in front of them.

Each server is tests/remote_server.py's (`server_argv`: the embedded model, a small pool,
prefix caching, per-request metrics, KV events on a concrete loopback endpoint that the
subscriber binds), with no API key (the router forwards requests as they come), and one
OpenMP thread pinned to its own core, so two share this machine's two cores.

Started once per test session (tests/conftest.py's `real_fleet`), both servers at once,
each bounded by START_TIMEOUT_S; the router waits for them to be healthy. Skipped with
the reason where vllm-router is not installed. Everything started is killed at the end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest
from remote_server import ServerPorts, VllmServer, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator

START_TIMEOUT_S = 240.0  # one server is about 40 s on this 2-core CPU; two at once, more
# A hang guard, not a speed: the router answers /health in about a second here, but a host
# loaded by other processes (or two engines starting beside it) can take many times that.
ROUTER_TIMEOUT_S = 120.0
NAMES = ("a", "b")


class FleetServer(VllmServer):
    """A remote_server VllmServer without an API key, its OpenMP thread on core `core`."""

    def __init__(self, core: int) -> None:
        super().__init__(ServerPorts(), api_key=None)
        self.core = core

    def env(self) -> dict[str, str]:
        return {**super().env(), "VLLM_CPU_OMP_THREADS_BIND": str(self.core)}


class Router:
    """`vllm-router` on loopback in front of `workers`, its Prometheus counter beside it."""

    def __init__(self, workers: list[str], policy: str) -> None:
        self.port, self.prometheus = free_port(), free_port()
        argv = [
            sys.executable, "-m", "vllm_router.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus),
            "--worker-startup-timeout-secs", str(int(ROUTER_TIMEOUT_S)),
            "--worker-startup-check-interval", "1", "--log-level", "warning",
            # A killed worker is out of the rotation within a few seconds, not a minute.
            "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
        ]  # fmt: skip
        self.http = httpx.Client(timeout=60)
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus}/metrics"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + ROUTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode()[-2000:] if self.proc.stderr else ""
                pytest.fail(f"vllm-router exited with {self.proc.returncode}: {err}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        pytest.fail(f"vllm-router did not answer /health within {ROUTER_TIMEOUT_S:.0f} s")

    def counters(self) -> str:
        return self.http.get(self.metrics_url).text

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


def router_installed() -> bool:
    return importlib.util.find_spec("vllm_router") is not None


NO_ROUTER = "vllm-router is not installed (pip install 'kvscope[fleet]')"


@dataclass
class RealFleet:
    servers: dict[str, FleetServer]
    router: Router
    start_seconds: float

    @property
    def replica_flags(self) -> list[str]:
        """What `--replica` would be given: name=URL, in order."""
        return [f"{name}={s.url}" for name, s in self.servers.items()]

    def kill(self, name: str) -> None:
        """SIGKILL replica `name`'s whole process group: a crash, not a shutdown."""
        self.servers[name].kill_hard()


@contextmanager
def running_fleet() -> Iterator[RealFleet]:
    """Two servers and the router, up within START_TIMEOUT_S; all killed afterwards."""
    if not router_installed():
        pytest.skip(NO_ROUTER)
    servers = {name: FleetServer(core) for core, name in enumerate(NAMES)}
    router: Router | None = None
    began = time.perf_counter()
    try:
        for server in servers.values():
            server.launch()
        deadline = began + START_TIMEOUT_S
        for server in servers.values():
            server.wait_healthy(deadline)
        router = Router([s.url for s in servers.values()], "round_robin")
        router.wait_ready()
        yield RealFleet(servers, router, time.perf_counter() - began)
    finally:
        if router is not None:
            router.stop()
        for server in servers.values():
            server.stop()
        alive = [name for name, s in servers.items() if s.group_alive()]
        assert not alive, f"vLLM server processes of {alive} outlived the tests"
