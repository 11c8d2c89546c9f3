"""Routing policy, measured: two CPU vLLM servers, two vLLM routers in front of both (one per
policy), and the same multi-turn chat workload through each (issue #21, item 4).

    python benchmarks/routing_policy.py                      # 4 sessions x 4 turns
    python benchmarks/routing_policy.py --sessions 2 --turns 3 --policies random,cache_aware

The servers run the embedded model with prefix caching on (vLLM's default), a 128 MiB KV
pool, one core each (VLLM_CPU_OMP_THREADS_BIND), and say per request how many prompt
tokens they found cached (`--enable-prompt-tokens-details --enable-per-request-metrics`).
Each server is warmed directly first, then one unmeasured pass of the same workload (other
words) goes through the round-robin router, so neither policy pays the servers' first-time
costs (measured without it: the policy run first was slower on every turn, cached or not).
The comparison itself is `kvscope bench --turns N --sessions M --compare-urls ...`, run as a
user would; its table is printed as it comes, then everything is stopped.
Ports 8300-8399 unless --base-port says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from remote_server import ServerPorts, VllmServer, model_dir  # noqa: E402

from benchmarks.host import HostLoad  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
MAX_MODEL_LEN = 2048
KV_CACHE_BYTES = 128 * 1024**2
SERVER_START_S = 600.0  # two servers loading at once on two busy cores
ROUTER_START_S = 60.0


class PolicyServer(VllmServer):
    """A CPU `vllm serve` of the embedded model on one core, with per-request cache hits."""

    def __init__(self, port: int, core: int) -> None:
        super().__init__(ServerPorts(http=port, kv_events=0, kv_replay=0), api_key=None)
        self.core = core

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_dir(), "--host", "127.0.0.1", "--port", str(self.ports.http),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--enforce-eager",
            "--enable-prompt-tokens-details", "--enable-per-request-metrics",
        ]  # fmt: skip

    def launch(self) -> None:
        """Start the process (without waiting), bound to its own core."""
        env = {
            **os.environ,
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
        }
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def wait_healthy(self, deadline: float) -> None:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM on :{self.ports.http} exited:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(1.0)
        raise TimeoutError(f"vLLM on :{self.ports.http} not healthy:\n{self.log_tail()}")

    def warm(self) -> None:
        """One short chat straight to this server: its one-off first-request costs."""
        body = {
            "model": model_dir(),
            "messages": [{"role": "user", "content": "warm up"}],
            "max_tokens": 4,
        }
        req = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()


class Router:
    """`vllm-router` (the `fleet` extra) on loopback in front of `workers`, one policy."""

    def __init__(self, workers: list[str], policy: str, port: int, prometheus: int) -> None:
        self.port, self.policy = port, policy
        argv = [
            sys.executable, "-m", "vllm_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus),
            "--worker-startup-timeout-secs", str(int(ROUTER_START_S)),
            "--worker-startup-check-interval", "1", "--log-level", "warning",
        ]  # fmt: skip
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = ROUTER_START_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"vllm-router exited with {self.proc.returncode}: {err}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.url + "/health", timeout=1) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"vllm-router ({self.policy}) not ready within {timeout_s:.0f} s")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.log.close()


@contextlib.contextmanager
def routers(workers: list[str], policies: list[str], base_port: int) -> Iterator[list[Router]]:
    """One router per policy, all in front of `workers`, ready; always stopped after."""
    started: list[Router] = []
    try:
        for i, policy in enumerate(policies):
            started.append(Router(workers, policy, base_port + 11 + i, base_port + 21 + i))
        for r in started:
            r.wait_ready()
        yield started
    finally:
        for r in started:
            r.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--message-len", type=int, default=48)
    p.add_argument("--output-len", type=int, default=24)
    p.add_argument("--policies", default="round_robin,cache_aware")
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--base-port", type=int, default=8300)
    p.add_argument("--json", help="keep the comparison's JSON here")
    p.add_argument(
        "--no-warm-pass", action="store_true", help="skip the unmeasured pass of the workload"
    )
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    servers = [PolicyServer(args.base_port + 1, 0), PolicyServer(args.base_port + 2, 1)]
    began = time.monotonic()
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_healthy(began + SERVER_START_S)
        print(f"servers up in {time.monotonic() - began:.0f} s", file=sys.stderr)
        for s in servers:
            s.warm()
        with routers([s.url for s in servers], policies, args.base_port) as fronts:
            urls = ",".join(f"{r.policy}={r.url}" for r in fronts)
            json_path = args.json or str(Path(tempfile.mkdtemp()) / "routing_policy.json")
            workload = [
                KVSCOPE, "bench", "--turns", str(args.turns), "--sessions", str(args.sessions),
                "--message-len", str(args.message_len), "--output-len", str(args.output_len),
                "--warmup", "0", "--kv-events", "off",
            ]  # fmt: skip
            if not args.no_warm_pass:
                # The first run on fresh servers meets every batch shape for the first time
                # (the CPU kernels build their primitives per shape): measured, the policy
                # run first was slower even on turns where neither found anything cached.
                # One unmeasured pass of the same workload (other words) through the router
                # that spreads over both servers pays that for both policies.
                spread = next((r for r in fronts if r.policy == "round_robin"), fronts[0])
                print(f"warm-up pass through {spread.policy} (not measured)", file=sys.stderr)
                warm = [*workload, "--seed", str(args.seed + 1), "--url", spread.url]
                subprocess.run(warm, cwd=ROOT, timeout=3600, check=True, stdout=subprocess.DEVNULL)
            cmd = [*workload, "--seed", str(args.seed), "--compare-urls", urls, "--json", json_path]
            host = HostLoad().start()
            run = subprocess.run(cmd, cwd=ROOT, timeout=3600, check=False)
            print(host.note())
            print(f"JSON: {json_path}")
            return run.returncode
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
