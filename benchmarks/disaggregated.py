"""Prefill here, decode there, against colocated serving of the same size (issue #33).

    python benchmarks/disaggregated.py                 # 2 rounds of each
    python benchmarks/disaggregated.py --rounds 3 --users 4 --prompt-len 512

Four CPU vLLM servers of the embedded model on loopback, one OpenMP thread each
(tests/real_fleet.py's FleetServer: 128 MiB KV pool, blocks of 32, float32):
- colocated: servers a (core 0) and b (core 1), each prefilling and decoding its own
  requests, kvscope sending to them in turn (`--replica a=URL --replica b=URL`);
- disaggregated: a prefill server (core 0, ExampleConnector as kv_producer) and a decode
  server (core 1, kv_consumer), sharing one KV folder, kvscope as the proxy
  (`--prefill URL --decode URL`).
The same total size: two servers, two cores. The workload is the same for both, and
mixed: `--users` users each sending its next request when the last one ends, prompts of
`--prompt-len` tokens spread by half either way, so long prompts arrive while other
requests decode. Rounds alternate (colocated, then disaggregated, with the same seed in
a round) and each prints the host's load; the table gives each side's medians over the
rounds and their ratio (disaggregated / colocated), and a sentence says what the run
showed: the figures P/D made better or worse, "no gain here" for the rest, and why.

On a 2-core CPU the pair cannot gain what it gains on GPUs: the four servers share the
same two cores, prefill and decode are both compute on a CPU, and the KV goes through
files. Each server is warmed first (one request straight to it). Ports are free ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from real_fleet import START_TIMEOUT_S, FleetServer  # noqa: E402
from real_pd import PdServer  # noqa: E402
from remote_server import model_dir  # noqa: E402

from benchmarks.host import HostLoad  # noqa: E402

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
FIGURES = (
    ("median_ttft_ms", "median TTFT ms"),
    ("p99_ttft_ms", "p99 TTFT ms"),
    ("median_itl_ms", "median ITL ms"),
    ("p99_itl_ms", "p99 ITL ms"),
    ("output_throughput", "output tok/s"),
)

LOWER_IS_BETTER = {"median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"}
NOISE = 0.10
"""A change smaller than this share of the colocated figure is no change: two rounds on
a shared host move that much between themselves."""
WHY = (
    "Why: the four servers share this host's two cores (the prefill server and a on core "
    "0, the decode server and b on core 1), so the prefill server's compute is taken from "
    "the decode server's, not added to it; prefill and decode are both compute on a CPU; "
    "and every prompt's KV goes through files. On GPUs the two phases get chips of their own."
)


def verdict(colocated: dict[str, float], pd: dict[str, float]) -> str:
    """What this run showed, in one sentence per kind of outcome: the figures P/D made
    better, those it made worse, and "no gain here" for the rest (all of them, when so)."""
    better: list[str] = []
    worse: list[str] = []
    same: list[str] = []
    for key, label in FIGURES:
        colo, split = colocated[key], pd[key]
        if colo <= 0 or split <= 0:
            continue
        ratio = split / colo
        gain = 1 / ratio if key in LOWER_IS_BETTER else ratio
        words = f"{label} {ratio:.2f}x"
        if gain >= 1 + NOISE:
            better.append(words)
        elif gain <= 1 / (1 + NOISE):
            worse.append(words)
        else:
            same.append(words)
    said = []
    if better:
        said.append(f"better with P/D: {', '.join(better)} of colocated")
    if worse:
        said.append(f"worse: {', '.join(worse)}")
    if same:
        said.append(f"no gain here: {', '.join(same)} (within {NOISE:.0%})")
    if not better:
        said.insert(0, "no gain here from splitting prefill and decode")
    return f"What this run showed: {'; '.join(said)}. {WHY}"


def warm(url: str) -> None:
    """One short request straight to a server: its first-request costs, paid unmeasured."""
    body = {"model": model_dir(), "prompt": "warm up", "max_tokens": 4}
    req = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def machine() -> str:
    cpu = "unknown CPU"
    flags: list[str] = []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "unknown CPU":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = sorted(
                    w for w in line.split(":", 1)[1].split() if w.startswith(("avx", "amx", "fma"))
                )
                break
    return f"{cpu}; {' '.join(flags)}"


def run_bench(
    target: list[str], args: argparse.Namespace, seed: int, out: Path
) -> dict[str, float]:
    cmd = [
        KVSCOPE, "bench", *target, "--kv-events", "off", "--warmup", "0",
        "--concurrency", str(args.users), "--num-prompts", str(args.requests),
        "--prompt-lens", str(args.prompt_len), "--range-ratio", "0.5",
        "--output-len", str(args.output_len), "--seed", str(seed),
        "--no-roofline", "--json", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, timeout=3600, check=True, stdout=subprocess.DEVNULL)
    point = json.loads(out.read_text())["points"][0]
    if point.get("failed"):
        raise SystemExit(f"{point['failed']} requests failed in {' '.join(target)}")
    return {key: float(point[key]) for key, _ in FIGURES}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--requests", type=int, default=16, help="requests per run")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=33)
    args = p.parse_args()
    print(f"machine: {machine()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="kvscope-pd-bench-") as folder:
        store = Path(folder) / "kv"
        store.mkdir()
        servers = {
            "a": FleetServer(0),
            "b": FleetServer(1),
            "prefill": PdServer(0, "kv_producer", store),
            "decode": PdServer(1, "kv_consumer", store),
        }
        began = time.perf_counter()
        try:
            for s in servers.values():
                s.launch()
            for s in servers.values():
                s.wait_healthy(began + 2 * START_TIMEOUT_S)  # four loading on two cores
                warm(s.url)
            print(f"4 servers up and warm in {time.perf_counter() - began:.0f} s", file=sys.stderr)
            sides = {
                "colocated": [
                    "--replica",
                    f"a={servers['a'].url}",
                    "--replica",
                    f"b={servers['b'].url}",
                ],
                "disaggregated": [
                    "--prefill",
                    servers["prefill"].url,
                    "--decode",
                    servers["decode"].url,
                ],
            }
            results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
            for r in range(args.rounds):
                seed = args.seed + r
                for name, target in sides.items():
                    host = HostLoad().start()
                    got = run_bench(target, args, seed, Path(folder) / f"{name}-{r}.json")
                    results[name].append(got)
                    print(
                        f"round {r + 1} {name:>13}: "
                        + ", ".join(f"{label} {got[key]:,.1f}" for key, label in FIGURES)
                        + f"; {host.note()}",
                        file=sys.stderr,
                    )
        finally:
            for s in servers.values():
                s.stop()
    print(
        f"\n{args.users} users, {args.requests} requests a run, prompts {args.prompt_len} "
        f"tokens +-50 %, {args.output_len} output tokens, {args.rounds} rounds (medians)"
    )
    print(f"{'':16}{'colocated':>12}{'P/D':>12}{'P/D / colo':>12}")
    medians = {
        side: {key: statistics.median(x[key] for x in runs) for key, _ in FIGURES}
        for side, runs in results.items()
    }
    for key, label in FIGURES:
        colo, pd = medians["colocated"][key], medians["disaggregated"][key]
        ratio = pd / colo if colo else float("nan")
        print(f"{label:16}{colo:12,.1f}{pd:12,.1f}{ratio:12.2f}")
    print(f"\n{verdict(medians['colocated'], medians['disaggregated'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
