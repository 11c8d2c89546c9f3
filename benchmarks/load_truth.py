"""Is kvscope's load runner the bottleneck or the error? A fake server with set timings.

A small OpenAI-compatible server of our own (tests/remote_server.py's FakeServer, one
thread per connection) streams every completion with a set time to the first token and a
set gap between tokens, whatever the load. kvscope's load runner drives it through
`RemoteEngine` (the `--url` path) with many users at once, and reports its measured TTFT
and ITL against the set values; then `vllm bench serve` drives the same server with the
same users, and its figures are printed beside kvscope's. Where both are within a few
milliseconds of the set values at thousands of tokens/s, the client side is neither the
bottleneck nor the error.

    python benchmarks/load_truth.py                   # 256 users, 64 tokens, ITL 40 ms
    python benchmarks/load_truth.py --users 64 --rounds 1 --no-vllm

Rounds alternate kvscope and vLLM, so both see the same host; each round prints how busy
the host was. The first round is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from remote_server import (  # noqa: E402
    FakeRequest,
    FakeServer,
    Reply,
    head,
    model_dir,
    sse_event,
)

from benchmarks.host import HostLoad  # noqa: E402


def timed_completion(ttft_s: float, itl_s: float) -> Any:
    """A route that streams `max_tokens` tokens: the first after `ttft_s`, then one every
    `itl_s`, each chunk stamped on the server's clock as it is sent (not accumulated
    sleeps, so a late thread does not shift every later token)."""

    def route(req: FakeRequest) -> Reply:
        body = req.json() or {}
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt)) // 4

        def write(sock: Any, stop: Any) -> None:
            start = time.monotonic()
            sock.sendall(head(200, "text/event-stream"))
            for i in range(n):
                due = start + ttft_s + i * itl_s
                wait = due - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    return
                choice = {"index": 0, "text": "x", "token_ids": [1000 + i], "finish_reason": None}
                if i == n - 1:
                    choice["finish_reason"] = "length"
                sock.sendall(sse_event({"choices": [choice]}))
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            }
            sock.sendall(sse_event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")

        return Reply(write)

    return route


def kvscope_round(url: str, users: int, output: int, prompts: int) -> dict[str, float]:
    from bench.load_result import LoadConfig
    from bench.load_runner import run_load
    from engine.remote.engine import RemoteEngine

    engine = RemoteEngine(url)
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
        (point,) = asyncio.run(run_load(engine, config)).points
    finally:
        engine.shutdown()
    return {
        "median_ttft_ms": point.median_ttft_ms,
        "median_itl_ms": point.median_itl_ms,
        "p99_itl_ms": point.p99_itl_ms,
        "output_throughput": point.output_throughput,
    }


# `vllm bench serve` itself: the `vllm` command asks for the package "vllm", which the CPU
# build is not named, so its parser and main are called as the command calls them.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks import serve; p = FlexibleArgumentParser(); "
    "serve.add_cli_args(p); serve.main(p.parse_args(sys.argv[1:]))"
)


def vllm_round(url: str, users: int, output: int, prompts: int) -> dict[str, float] | str:
    with tempfile.TemporaryDirectory() as folder:
        cmd = [
            sys.executable, "-c", VLLM_BENCH_SERVE,
            "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake-model",
            "--tokenizer", model_dir(), "--dataset-name", "random",
            "--random-input-len", "16", "--random-output-len", str(output),
            "--num-prompts", str(prompts), "--max-concurrency", str(users),
            "--ignore-eos", "--save-result", "--result-dir", folder,
            "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        files = list(Path(folder).glob("*.json"))
        if done.returncode != 0 or not files:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return "vllm bench serve failed: " + " | ".join(tail)
        data = json.loads(files[0].read_text())
    return {
        "median_ttft_ms": float(data["median_ttft_ms"]),
        "median_itl_ms": float(data["median_itl_ms"]),
        "p99_itl_ms": float(data["p99_itl_ms"]),
        "output_throughput": float(data["output_throughput"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=256)
    ap.add_argument("--output", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--itl-ms", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds after a warm-up")
    ap.add_argument("--no-vllm", action="store_true", help="skip vllm bench serve")
    args = ap.parse_args()
    prompts = args.users * 2
    route = timed_completion(args.ttft_ms / 1e3, args.itl_ms / 1e3)
    server = FakeServer({"/v1/completions": route, "/v1/chat/completions": route})
    server_listen_more(server)
    print(
        f"fake server {server.url}: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms set; "
        f"{args.users} users x {args.output} tokens, {prompts} requests a round "
        f"(~{args.users * 1e3 / args.itl_ms:,.0f} tokens/s asked)"
    )
    results: dict[str, list[dict[str, float]]] = {"kvscope": [], "vllm bench serve": []}
    try:
        for r in range(args.rounds + 1):
            for who in ("kvscope", "vllm bench serve"):
                if who != "kvscope" and args.no_vllm:
                    continue
                host = HostLoad().start()
                run = kvscope_round if who == "kvscope" else vllm_round
                got = run(server.url, args.users, args.output, prompts)
                label = "warm-up" if r == 0 else f"round {r}"
                if isinstance(got, str):
                    print(f"{label} {who}: {got}")
                    continue
                print(
                    f"{label} {who:>16}: TTFT p50 {got['median_ttft_ms']:7.1f} ms  "
                    f"ITL p50 {got['median_itl_ms']:6.2f} p99 {got['p99_itl_ms']:6.2f} ms  "
                    f"{got['output_throughput']:7,.0f} tok/s  ({host.note()})"
                )
                server.requests.clear()
                if r:
                    results[who].append(got)
    finally:
        server.stop()
    print(f"\nerror against the set values (median over {args.rounds} rounds):")
    for who, rows in results.items():
        if not rows:
            continue
        ttft = statistics.median(x["median_ttft_ms"] for x in rows) - args.ttft_ms
        itl = statistics.median(x["median_itl_ms"] for x in rows) - args.itl_ms
        tps = statistics.median(x["output_throughput"] for x in rows)
        print(f"  {who:>16}: TTFT {ttft:+7.2f} ms  ITL {itl:+6.3f} ms  at {tps:,.0f} tokens/s")
    return 0


def server_listen_more(server: FakeServer) -> None:
    # Hundreds of users connect at once: a longer accept queue than the tests need.
    server._listener.listen(1024)


if __name__ == "__main__":
    sys.exit(main())
