"""Is kvscope's load runner the bottleneck or the error? A fake server with set timings.

A small OpenAI-compatible server of our own (benchmarks/timed_server.py: its own
process, one asyncio loop, chunked keep-alive streams as vLLM's server sends them)
streams every completion with a set time to the first token and a set gap between
tokens, whatever the load. kvscope's load runner drives it through `RemoteEngine` (the
`--url` path) with many users at once, and `vllm bench serve` drives the same server
with the same users; both are printed side by side, against the set values. Where both
are within a few milliseconds of them at thousands of tokens/s, the client side is
neither the bottleneck nor the error.

    python benchmarks/load_truth.py                   # 256 users, 64 tokens, ITL 40 ms
    python benchmarks/load_truth.py --users 64 --rounds 1 --no-vllm
    python benchmarks/load_truth.py --server mock     # GuideLLM's mock server instead
    python benchmarks/load_truth.py --users 256,512,1024 --itl-ms 20 --no-vllm --rounds 1
                                                      # the most one client sustains

`--server mock` drives GuideLLM's mock server (benchmarks/guidellm_mock.py, from
.venv-mock): a server someone else wrote, not vLLM, so kvscope counts prompts with its own
tokenizer and sends text. It keeps no record of how late it sent, so its column of
"error against what the server sent" is the error against the set value.

Rounds alternate kvscope and vLLM (kvscope, vllm, kvscope, vllm, ...), so both see the
same host; each round prints how busy the host was, and how late the server itself sent
its tokens (a client cannot be more right than its server). The first round of each is
a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.host import HostLoad  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

FIGURES = (
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "output_throughput",
)


@dataclass
class Round:
    who: str
    figures: dict[str, float]
    host: str
    server: dict[str, float]


class ServerProcess:
    """benchmarks/timed_server.py in a process of its own; `stop()` ends it."""

    name = "timed server"

    def __init__(self, ttft_ms: float, itl_ms: float, max_streams: int = 0) -> None:
        argv = [
            sys.executable, str(ROOT / "benchmarks" / "timed_server.py"),
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
            "--max-streams", str(max_streams),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"the timed server did not start (it said {line!r})")
        self.url = f"http://127.0.0.1:{line}"

    def stats(self) -> dict[str, float]:
        """How late the server sent the tokens since the last call, and its peak streams."""
        with urllib.request.urlopen(self.url + "/stats", timeout=30) as r:
            data: dict[str, float] = json.loads(r.read())
        return data

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class MockProcess:
    """GuideLLM's mock server, with the same face as ServerProcess; it has no /stats."""

    name = "GuideLLM mock server"

    def __init__(self, ttft_ms: float, itl_ms: float) -> None:
        from benchmarks.guidellm_mock import MockServer

        self.mock = MockServer(ttft_ms, itl_ms).start()
        self.url = self.mock.url

    def stats(self) -> dict[str, float]:
        return {}

    def stop(self) -> None:
        self.mock.stop()


def kvscope_round(url: str, users: int, output: int, prompts: int) -> dict[str, float] | str:
    from bench.load_result import LoadConfig, LoadPoint
    from bench.load_runner import LoadTick, run_load
    from engine.remote.engine import RemoteEngine

    engine = RemoteEngine(url, kv_events=None)
    engine.start()
    try:
        config = LoadConfig(
            mode="concurrency",
            levels=(float(users),),
            prompt_len=16,
            output_len=output,
            num_prompts=prompts,
            warmup=0,
        )
        # The CPU of every thread of this process (the client's own), from the first
        # request sent to the result: as `vllm bench serve`'s is read (vllm_round), with
        # the prompts made before it left out.
        # It ends with the result, inside the coroutine: on Python 3.11 asyncio.run's
        # teardown formats the coroutine's result into an error message it then drops
        # (restoring SIGINT's handler, the signal module's enum lookup fails on it),
        # 0.1-0.2 s for a point of 512 requests: once a run, not the client's per token.
        began: list[float] = []

        def first_send(_tick: LoadTick) -> None:
            if not began:
                began.append(time.process_time())

        async def measured() -> tuple[LoadPoint, float]:
            (point,) = (await run_load(engine, config, on_progress=first_send)).points
            return point, time.process_time() - began[0]

        point, cpu = asyncio.run(measured())
    finally:
        engine.shutdown()
    if point.completed < prompts:
        return f"only {point.completed} of {prompts} requests completed ({point.error})"
    figures = {name: float(getattr(point, name)) for name in FIGURES}
    figures["cpu_us_per_token"] = cpu / (prompts * output) * 1e6
    return figures


def kvscope_process_round(
    url: str, users: int, output: int, prompts: int
) -> dict[str, float] | str:
    """`kvscope_round` in a fresh interpreter of its own, as `vllm bench serve` runs: both
    clients then start equal, with nothing else in their process (a pytest worker holds
    engines and threads of its own) and the same share of a busy host."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from benchmarks.load_truth import kvscope_round; "
        "print(json.dumps(kvscope_round(sys.argv[2], *map(int, sys.argv[3:]))))"
    )
    argv = [sys.executable, "-c", code, str(ROOT), url, str(users), str(output), str(prompts)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return "kvscope's round failed: " + done.stderr.strip()[-500:]
    got: dict[str, float] | str = json.loads(done.stdout.strip().splitlines()[-1])
    return got


# `vllm bench serve` itself: the `vllm` command asks for the package "vllm", which the CPU
# build is not named, so its parser and main are called as the command calls them.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks import serve; p = FlexibleArgumentParser(); "
    "serve.add_cli_args(p); serve.main(p.parse_args(sys.argv[1:]))"
)


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (all its threads), from /proc; 0 where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vllm_round(url: str, users: int, output: int, prompts: int) -> dict[str, float] | str:
    """One `vllm bench serve` run. Its CPU is read from /proc while it runs, from its
    "Starting main benchmark run" to its result, so importing vLLM is left out."""
    from engine.model_prep import embedded_model_dir

    with tempfile.TemporaryDirectory() as folder:
        cmd = [
            sys.executable, "-u", "-c", VLLM_BENCH_SERVE,
            "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake-model",
            "--tokenizer", str(embedded_model_dir()), "--dataset-name", "random",
            "--random-input-len", "16", "--random-output-len", str(output),
            "--num-prompts", str(prompts), "--max-concurrency", str(users),
            "--ignore-eos", "--save-result", "--result-dir", folder,
            "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        began = ended = 0.0
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if "Starting main benchmark run" in line:
                began = _cpu_s(proc.pid)
            elif "Serving Benchmark Result" in line:
                ended = _cpu_s(proc.pid)
        proc.wait(timeout=60)
        files = list(Path(folder).glob("*.json"))
        if proc.returncode != 0 or not files:
            return "vllm bench serve failed: " + " | ".join(x.strip() for x in lines[-3:])
        data = json.loads(files[0].read_text())
    if int(data.get("completed", 0)) < prompts:
        return f"vllm bench serve: only {data.get('completed')} of {prompts} completed"
    figures = {name: float(data[name]) for name in FIGURES}
    figures["cpu_us_per_token"] = max(ended - began, 0.0) / (prompts * output) * 1e6
    return figures


def table(rounds: list[Round], ttft_ms: float, itl_ms: float, users: int) -> str:
    """The side-by-side, each figure the median over the measured rounds of each client:
    its value, its error against the set value, and [its error against what the server
    actually kept in that round]: on a busy host the server itself runs late, and the
    second error is then the client's own."""

    def cell(key: str, set_ms: float) -> Callable[[dict[str, float]], str]:
        def show(f: dict[str, float]) -> str:
            sent = f" [{f['sent ' + key]:+6.2f}]" if "sent " + key in f else " [ n/a ]"
            return f"{f[key]:8.2f} ({f[key] - set_ms:+7.2f}){sent}"

        return show

    rows: list[tuple[str, Callable[[dict[str, float]], str]]] = [
        ("streams", lambda f: f"{users}"),
        ("output tokens/s", lambda f: f"{f['output_throughput']:,.0f}"),
        ("client CPU µs a token", lambda f: f"{f['cpu_us_per_token']:.0f}"),
        (
            "server late (mean ms)",
            lambda f: f"{f['mean_late_ms']:.2f}" if "mean_late_ms" in f else "not said",
        ),
    ]
    for stat in ("mean", "median", "p99"):
        for name, set_ms in (("ttft", ttft_ms), ("itl", itl_ms)):
            label = f"{'p50' if stat == 'median' else stat} {name.upper()} ms (set {set_ms:g})"
            rows.append((label, cell(f"{stat}_{name}_ms", set_ms)))
    who = ["kvscope", "vllm bench serve"]
    per: dict[str, dict[str, float]] = {}
    for w in who:
        mine = [r for r in rounds if r.who == w]
        if not mine:
            continue
        merged = [
            r.figures
            | (
                {f"sent {k}": r.figures[k] - r.server.get(k, 0.0) for k in FIGURES}
                if r.server
                else {}
            )
            | ({"mean_late_ms": r.server["mean_late_ms"]} if r.server else {})
            for r in mine
        ]
        per[w] = {k: statistics.median(m[k] for m in merged) for k in merged[0]}
    shown = [w for w in who if w in per]
    out = [f"{'':26}" + "".join(f"{w:>32}" for w in shown)]
    for label, show in rows:
        out.append(f"{label:26}" + "".join(f"{show(per[w]):>32}" for w in shown))
    return "\n".join(out)


def measure_level(
    server: ServerProcess | MockProcess, users: int, args: argparse.Namespace, *, warm_up: bool
) -> list[Round]:
    """Rounds of each client at `users` streams, by turns, each printed as it ends; the
    measured ones returned (a warm-up round of each first, if `warm_up`)."""
    prompts = args.prompts or users * 2
    rounds: list[Round] = []
    first = 0 if warm_up else 1
    for r in range(first, args.rounds + 1):
        for who in ("kvscope", "vllm bench serve"):
            if who != "kvscope" and args.no_vllm:
                continue
            host = HostLoad().start()
            server.stats()  # zero the server's own lateness for this round
            if who == "kvscope":
                got = kvscope_process_round(server.url, users, args.output, prompts)
            else:
                got = vllm_round(server.url, users, args.output, prompts)
            note = host.note()
            late = server.stats()
            sent = (
                f"server {late['peak_streams']:.0f} streams at once, sent "
                f"{late['mean_late_ms']:.2f} ms late on average, worst "
                f"{late['worst_late_ms']:.1f}"
                if late
                else "the server says nothing of its own lateness"
            )
            label = "warm-up" if r == 0 else f"round {r}"
            if isinstance(got, str):
                print(f"{label:>8} {who:>16}: {got}")
                continue
            print(
                f"{label:>8} {who:>16}: TTFT p50 {got['median_ttft_ms']:7.1f} "
                f"p99 {got['p99_ttft_ms']:7.1f} ms  ITL p50 {got['median_itl_ms']:6.2f} "
                f"p99 {got['p99_itl_ms']:6.2f} ms  {got['output_throughput']:6,.0f} tok/s, "
                f"{got['cpu_us_per_token']:.0f} µs CPU a token  "
                f"({note}; {sent})",
                flush=True,
            )
            if r:
                rounds.append(Round(who, got, note, late))
    return rounds


def sustained(levels: dict[int, list[Round]], itl_ms: float) -> list[str]:
    """For each client, the highest output tokens/s among the levels where its median ITL
    (the median over its rounds) was within 1 ms of the set ITL, and the CPU it cost."""
    lines = []
    for who in ("kvscope", "vllm bench serve"):
        best: tuple[float, int, float, float] | None = None
        for users, rounds in levels.items():
            mine = [r.figures for r in rounds if r.who == who]
            if not mine:
                continue
            error = statistics.median(f["median_itl_ms"] for f in mine) - itl_ms
            rate = statistics.median(f["output_throughput"] for f in mine)
            cpu = statistics.median(f["cpu_us_per_token"] for f in mine)
            if abs(error) < 1.0 and (best is None or rate > best[0]):
                best = (rate, users, error, cpu)
        if best is not None:
            rate, users, error, cpu = best
            lines.append(
                f"{who}: {rate:,.0f} tokens/s at {users} streams, median ITL error "
                f"{error:+.2f} ms, {cpu:.0f} µs CPU a token ({rate * cpu / 1e6:.2f} cores)"
            )
        elif any(r.who == who for rounds in levels.values() for r in rounds):
            lines.append(f"{who}: no level kept its median ITL within 1 ms")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--users", default="256",
        help="streams at once; a list (64,256,1024) measures each level in turn and says "
        "the highest tokens/s each client sustained with its median ITL within 1 ms",
    )  # fmt: skip
    ap.add_argument("--output", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--itl-ms", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds after a warm-up")
    ap.add_argument("--prompts", type=int, default=0, help="requests a round (2 x users)")
    ap.add_argument("--no-vllm", action="store_true", help="skip vllm bench serve")
    ap.add_argument(
        "--server", choices=("timed", "mock"), default="timed",
        help="kvscope's timed server (default) or GuideLLM's mock server",
    )  # fmt: skip
    args = ap.parse_args()
    try:
        users_levels = [int(u) for u in str(args.users).split(",") if u.strip()]
    except ValueError:
        ap.error(f"--users {args.users}: a number of streams, or a list of them (64,256)")
    if not users_levels or min(users_levels) < 1:
        ap.error("--users: give at least one number of streams, each 1 or more")
    server: ServerProcess | MockProcess = (MockProcess if args.server == "mock" else ServerProcess)(
        args.ttft_ms, args.itl_ms
    )
    levels: dict[int, list[Round]] = {}
    try:
        for i, users in enumerate(users_levels):
            prompts = args.prompts or users * 2
            print(
                f"{server.name} {server.url} (own process): TTFT {args.ttft_ms:g} ms, ITL "
                f"{args.itl_ms:g} ms set; {users} streams x {args.output} tokens, {prompts} "
                f"requests a round (~{users * 1e3 / args.itl_ms:,.0f} tokens/s asked)"
            )
            levels[users] = measure_level(server, users, args, warm_up=i == 0)
    finally:
        server.stop()
    for users, rounds in levels.items():
        if rounds:
            print(
                f"\n{users} streams, median over {args.rounds} measured rounds: value (error "
                "against the set value) [error against what the server sent]"
            )
            print(table(rounds, args.ttft_ms, args.itl_ms, users))
    if len(levels) > 1:
        print("\nthe highest output tokens/s with the median ITL within 1 ms of the set value:")
        for line in sustained(levels, args.itl_ms):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
