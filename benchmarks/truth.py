"""Benchmark (not a test): kvscope's per-request timings against vLLM's own, in one process.

vLLM keeps, for every request, its own TTFT (from its arrival time) and the engine core's
timestamp of every token; kvscope reports those beside its own figures. Three situations:
  single    one request at a time
  4 at once four requests sent together
  behind    a 64-token request sent while a 3,000-token prefill runs
It prints, per request, the median and max |ITL difference|, both TTFTs, and the time the
request spent in kvscope's queue (stream() called -> vLLM's arrival), plus host load.

    .venv/bin/python benchmarks/truth.py
    .venv/bin/python benchmarks/truth.py --concurrency 32   # only: 32 short requests at once

`--concurrency N` sends N short requests (16-47 prompt tokens, 32 output tokens) at once
and sums every token's |ITL difference| over all of them: kvscope's relay and event loop
under load, against vLLM's own per-token times.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typing import TYPE_CHECKING

from benchmarks.host import HostLoad
from engine.events import GenerationRequest, RequestFinished, SamplingSettings

if TYPE_CHECKING:
    from engine.protocol import Engine

ARGV = ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(128 * 1024**2)]


async def run(engine: Engine, rid: str, n: int, max_tokens: int, seed: int) -> RequestFinished:
    ids = engine.synthetic_prompt(n, seed=seed)
    sampling = SamplingSettings(max_tokens=max_tokens, ignore_eos=True)
    last = None
    async for event in engine.stream(
        GenerationRequest(rid, prompt_token_ids=ids, sampling=sampling)
    ):
        last = event
    assert isinstance(last, RequestFinished)
    return last


def row(case: str, done: RequestFinished) -> str:
    v = done.vllm
    assert v is not None
    assert done.ttft_s is not None
    assert v.ttft_s is not None
    diffs = [abs(a - b) for a, b in zip(done.itl_s, v.itl_s, strict=True)] or [0.0]
    return (
        f"{case:<10} {done.request_id:<12} {done.prompt_tokens:>6} "
        f"{statistics.median(diffs) * 1e3:>10.4f} {max(diffs) * 1e3:>8.4f} "
        f"{done.ttft_s * 1e3:>10.1f} {v.ttft_s * 1e3:>10.1f} {v.kvscope_queue_s * 1e3:>10.1f}"
    )


async def main_async(engine: Engine) -> None:
    await run(engine, "warm", 64, 4, seed=1)
    print(
        f"{'case':<10} {'request':<12} {'prompt':>6} {'med |dITL|':>10} {'max':>8} "
        f"{'TTFT ours':>10} {'TTFT vLLM':>10} {'our queue':>10}   (ms)"
    )
    load = HostLoad().start()
    for i in range(3):
        print(row("single", await run(engine, f"single-{i}", 256 + 256 * i, 32, seed=10 + i)))
    for done in await asyncio.gather(
        *(run(engine, f"conc-{i}", 128 + 64 * i, 32, seed=20 + i) for i in range(4))
    ):
        print(row("4 at once", done))
    long_task = asyncio.create_task(run(engine, "long-3000", 3000, 2, seed=30))
    await asyncio.sleep(0.2)
    short = await run(engine, "behind", 64, 16, seed=31)
    long = await long_task
    print(row("behind", short))
    print(row("the long", long))
    print(f"host during the measurements: {load.note()}")


async def concurrent_async(engine: Engine, n: int) -> None:
    await run(engine, "warm", 16, 4, seed=1)
    load = HostLoad().start()
    done = await asyncio.gather(
        *(run(engine, f"c{n}-{i}", 16 + i % 32, 32, seed=100 + i) for i in range(n))
    )
    note = load.note()
    diffs: list[float] = []
    ours: list[float] = []
    theirs: list[float] = []
    for d in done:
        v = d.vllm
        assert v is not None
        diffs += [abs(a - b) for a, b in zip(d.itl_s, v.itl_s, strict=True)]
        ours += d.itl_s
        theirs += v.itl_s
    diffs.sort()
    p99 = diffs[min(len(diffs) - 1, int(0.99 * len(diffs)))]
    print(
        f"{n} requests at once, {len(diffs)} ITLs: |ΔITL| median "
        f"{statistics.median(diffs) * 1e3:.4f} ms, p99 {p99 * 1e3:.4f} ms, max "
        f"{diffs[-1] * 1e3:.4f} ms; mean ITL kvscope "
        f"{statistics.mean(ours) * 1e3:.3f} ms, vLLM {statistics.mean(theirs) * 1e3:.3f} ms; "
        f"median ITL kvscope {statistics.median(ours) * 1e3:.3f} ms, vLLM "
        f"{statistics.median(theirs) * 1e3:.3f} ms"
    )
    print(f"host during the measurement: {note}")


def main() -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    concurrency = 0
    if "--concurrency" in sys.argv:
        concurrency = int(sys.argv[sys.argv.index("--concurrency") + 1])
    print(f"kvscope truth benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    engine = VllmEngine(argv=ARGV)
    engine.start()
    try:
        if concurrency:
            asyncio.run(concurrent_async(engine, concurrency))
        else:
            asyncio.run(main_async(engine))
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
