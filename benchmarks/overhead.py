"""Benchmark (not a test): what kvscope's step loop costs on top of a bare vLLM loop.

One warm in-process engine, two ways, in alternating rounds so host noise hits both:
  bare     add_request() + step() until done, run on kvscope's own step thread
  kvscope  the same requests through VllmEngine.stream(): events, samples, hand-off
Cases (from issue 12):
  decode   8 prompts of 32 tokens -> 256 output tokens each
  prefill  2,048-token prompts -> 8 output tokens
It prints each round's throughput ratio (kvscope / bare; 1.00 = no cost), the median, the
per-step bookkeeping kvscope adds (time in its step loop outside vLLM's step()), and how
busy the host was during each round.

    .venv/bin/python benchmarks/overhead.py [--rounds 3] [--case decode|prefill|both]
    .venv/bin/python benchmarks/overhead.py --scale    # 256 requests x 256 blocks, no engine
    .venv/bin/python benchmarks/overhead.py --mfu      # vLLM's FLOP/byte count on vs off

--mfu (issue 32): kvscope turns on vLLM's `--enable-mfu-metrics` by default, so each step
also runs `ModelMetrics.get_step_perf_stats_per_gpu` in the scheduler. The same warm engine
runs the decode case with the scheduler's `perf_metrics` set and unset, in alternating
rounds, and times the count itself inside each step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import HostLoad
from engine.events import GenerationRequest, RequestFinished, SamplingSettings

if TYPE_CHECKING:
    from collections.abc import Callable

ARGV = ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(256 * 1024**2)]


@dataclass
class Case:
    name: str
    prompts: int
    prompt_len: int
    output_len: int
    concurrent: bool


CASES = {
    "decode": Case("decode", 8, 32, 256, True),
    "prefill": Case("prefill", 2, 2048, 8, False),
}


@dataclass
class StepCost:
    step_s: float = 0.0  # inside vLLM's step()
    loop_s: float = 0.0  # the whole of kvscope's _one_step
    steps: int = 0
    on: bool = False
    installed_on: int | None = None  # id() of the engine whose steps are timed


COST = StepCost()  # one set of timers per engine: wrapping step() twice would count twice


def on_step_thread(engine: Any, fn: Callable[[Any], Any]) -> Any:
    """Run `fn(llm_engine)` on the engine's own step thread, between steps; wait for it."""
    done = threading.Event()
    out: list[Any] = []

    def call(llm: Any) -> None:
        try:
            out.append(fn(llm))
        finally:
            done.set()

    engine._commands.put(("call", call))
    done.wait()
    return out[0]


def bare_round(engine: Any, prompts: list[tuple[int, ...]], case: Case) -> tuple[float, int]:
    def run(llm: Any) -> tuple[float, int]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=case.output_len, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        tokens = 0
        started = time.perf_counter()
        batches = [prompts] if case.concurrent else [[p] for p in prompts]
        for n, batch in enumerate(batches):
            for i, ids in enumerate(batch):
                llm.add_request(
                    f"bare-{time.monotonic_ns()}-{n}-{i}",
                    TokensPrompt(prompt_token_ids=list(ids)),  # type: ignore[typeddict-item]
                    params,
                )
            while llm.has_unfinished_requests():
                for out in llm.step():
                    tokens += len(out.outputs[0].token_ids) if out.outputs else 0
        elapsed = time.perf_counter() - started
        engine._introspector.take_scheduled()  # leave no stale step summary behind
        return elapsed, tokens

    result: tuple[float, int] = on_step_thread(engine, run)
    return result


async def kvscope_round(
    engine: Any, prompts: list[tuple[int, ...]], case: Case
) -> tuple[float, int]:
    sampling = SamplingSettings(max_tokens=case.output_len, ignore_eos=True)

    async def one(i: int, ids: tuple[int, ...]) -> int:
        last = None
        request = GenerationRequest(
            f"kv-{time.monotonic_ns()}-{i}", prompt_token_ids=ids, sampling=sampling
        )
        async for event in engine.stream(request):
            last = event
        assert isinstance(last, RequestFinished)
        return last.output_tokens

    started = time.perf_counter()
    if case.concurrent:
        counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    else:
        counts = [await one(i, p) for i, p in enumerate(prompts)]
    return time.perf_counter() - started, sum(counts)


def instrument(engine: Any, cost: StepCost) -> None:
    def patch(llm: Any) -> None:
        inner = llm.step

        def step() -> Any:
            t = time.perf_counter()
            try:
                return inner()
            finally:
                if cost.on:
                    cost.step_s += time.perf_counter() - t

        llm.step = step

    on_step_thread(engine, patch)
    outer = engine._one_step

    def one_step(llm: Any) -> None:
        t = time.perf_counter()
        outer(llm)
        if cost.on:
            cost.loop_s += time.perf_counter() - t
            cost.steps += 1

    engine._one_step = one_step


def run_case(engine: Any, case: Case, rounds: int) -> None:
    prompts = [engine.synthetic_prompt(case.prompt_len, seed=1000 + i) for i in range(case.prompts)]
    # Warm-up, both ways, so neither pays first-use costs.
    bare_round(engine, prompts[:1], Case(case.name, 1, case.prompt_len, 8, False))
    asyncio.run(kvscope_round(engine, prompts[:1], Case(case.name, 1, case.prompt_len, 8, False)))
    cost = COST
    cost.step_s = cost.loop_s = 0.0
    cost.steps = 0
    if cost.installed_on != id(engine):  # a second engine in this process is timed too
        instrument(engine, cost)
        cost.installed_on = id(engine)
    print(f"\n{case.name}: {case.prompts} x {case.prompt_len}-token prompts", end="")
    print(f" -> {case.output_len} tokens")
    head = f"{'round':>5}  {'bare tok/s':>10}  {'kvscope tok/s':>13}  {'ratio':>6}"
    print(head + "  host (bare | kvscope)")
    ratios = []
    for r in range(rounds):
        # Alternate which goes first, so a trend in host load does not favour either.
        order = ("bare", "kvscope") if r % 2 == 0 else ("kvscope", "bare")
        rates: dict[str, float] = {}
        notes: dict[str, str] = {}
        for who in order:
            load = HostLoad().start()
            if who == "bare":
                elapsed, tokens = bare_round(engine, prompts, case)
            else:
                cost.on = True
                elapsed, tokens = asyncio.run(kvscope_round(engine, prompts, case))
                cost.on = False
            rates[who] = tokens / elapsed
            notes[who] = load.note()
        ratio = rates["kvscope"] / rates["bare"]
        ratios.append(ratio)
        print(
            f"{r + 1:>5}  {rates['bare']:>10.1f}  {rates['kvscope']:>13.1f}  {ratio:>6.3f}  "
            f"{notes['bare']} | {notes['kvscope']}"
        )
    book = cost.loop_s - cost.step_s
    share = book / cost.step_s if cost.step_s else 0.0
    print(f"median ratio (kvscope / bare): {statistics.median(ratios):.3f}")
    print(
        f"step-loop bookkeeping: {book / max(cost.steps, 1) * 1e3:.3f} ms a step "
        f"= {share:.2%} of vLLM's step time, over {cost.steps} steps"
    )


def run_mfu(engine: Any, case: Case, rounds: int) -> None:
    """kvscope's decode case with vLLM's per-step FLOP/byte count on and off, alternating."""
    prompts = [engine.synthetic_prompt(case.prompt_len, seed=1000 + i) for i in range(case.prompts)]
    asyncio.run(kvscope_round(engine, prompts[:1], Case(case.name, 1, case.prompt_len, 8, False)))
    counted = StepCost()

    def install(llm: Any) -> Any:
        metrics = engine._introspector.scheduler.perf_metrics
        if metrics is None:
            raise SystemExit("this engine was started without --enable-mfu-metrics")
        inner = metrics.get_step_perf_stats_per_gpu

        def timed(scheduler_output: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(scheduler_output)
            finally:
                counted.step_s += time.perf_counter() - t
                counted.steps += 1

        metrics.get_step_perf_stats_per_gpu = timed
        return metrics

    metrics = on_step_thread(engine, install)

    def switch(on: bool) -> None:
        def set_it(llm: Any) -> None:
            engine._introspector.scheduler.perf_metrics = metrics if on else None

        on_step_thread(engine, set_it)

    print(f"\nmfu count: {case.prompts} x {case.prompt_len}-token prompts -> {case.output_len}")
    print(f"{'round':>5}  {'off tok/s':>10}  {'on tok/s':>10}  {'on/off':>6}  host (off | on)")
    ratios = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        rates: dict[bool, float] = {}
        notes: dict[bool, str] = {}
        for on in order:
            switch(on)
            load = HostLoad().start()
            elapsed, tokens = asyncio.run(kvscope_round(engine, prompts, case))
            rates[on] = tokens / elapsed
            notes[on] = load.note()
        switch(True)
        ratios.append(rates[True] / rates[False])
        print(
            f"{r + 1:>5}  {rates[False]:>10.1f}  {rates[True]:>10.1f}  {ratios[-1]:>6.3f}  "
            f"{notes[False]} | {notes[True]}"
        )
    print(f"median throughput ratio (count on / off): {statistics.median(ratios):.3f}")
    print(
        f"the count itself: {counted.step_s / max(counted.steps, 1) * 1e6:.1f} µs a step, "
        f"over {counted.steps} steps"
    )


def run_scale(requests: int, blocks_each: int, steps: int) -> None:
    full = _scale(requests, blocks_each, steps, incremental=False)
    inc = _scale(requests, blocks_each, steps, incremental=True)
    for name, (med, p90) in (("full copy each step", full), ("incremental (kvscope)", inc)):
        print(
            f"scale, {name}: {requests} requests x {blocks_each} blocks: median "
            f"{med * 1e3:.2f} ms a step (p90 {p90 * 1e3:.2f} ms) = {med / 0.025:.1%} of a 25 ms "
            "GPU decode step"
        )
    print(f"incremental / full: {inc[0] / full[0]:.3f}")


def _scale(
    requests: int, blocks_each: int, steps: int, *, incremental: bool
) -> tuple[float, float]:
    """The per-step bookkeeping alone at GPU scale, on constructed scheduler state."""
    from engine.events import StepSample
    from engine.listeners import StepListeners
    from engine.vllm.internals import EngineIntrospector, GroupReader

    class Req:
        def __init__(self, i: int) -> None:
            self.request_id = f"r{i}"
            self.num_computed_tokens = blocks_each * 16

    class Block:
        def __init__(self, block_id: int) -> None:
            self.block_id = block_id

    reqs = [Req(i) for i in range(requests)]
    # A decode step at block size 16: every request grows one block in 16 steps.
    table = {
        r.request_id: [Block(1 + i * 4 * blocks_each + j) for j in range(blocks_each)]
        for i, r in enumerate(reqs)
    }

    class Coordinator:
        def __init__(self) -> None:
            self.single_type_managers = [type("M", (), {"req_to_blocks": table})()]

    intro = EngineIntrospector.__new__(EngineIntrospector)
    intro.scheduler = type("S", (), {"running": reqs})()

    class KvManager:
        coordinator = Coordinator()

        def get_block_ids(self, rid: str) -> tuple[list[int]]:  # vLLM's full-copy path
            return ([b.block_id for b in table[rid]],)

    manager = KvManager()
    groups = (GroupReader(manager.coordinator.single_type_managers[0], 16),)
    intro._begin(manager, groups if incremental else ())  # (): vLLM's full-copy path
    external = {r.request_id: r.request_id for r in reqs}
    listeners = StepListeners()
    got: list[StepSample] = []
    listeners.add(got.append)
    times = []
    for step in range(steps):
        for i in range(step % 16, requests, 16):
            r = reqs[i]
            r.num_computed_tokens += 1
            blocks = table[r.request_id]
            blocks.append(Block(blocks[-1].block_id + 1))
        t = time.perf_counter()
        held = intro.live_blocks(external)
        listeners.emit(
            StepSample(step, 0.0, 0.0, 0, requests, requests, 0, 0.5, 0, 100_000, 16, held)
        )
        times.append(time.perf_counter() - t)
        got.clear()
    return statistics.median(times), sorted(times)[int(len(times) * 0.9)]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--case", choices=("decode", "prefill", "both"), default="both")
    p.add_argument("--scale", action="store_true", help="only the GPU-scale bookkeeping check")
    p.add_argument("--mfu", action="store_true", help="vLLM's FLOP/byte count on vs off (decode)")
    args = p.parse_args()
    print(f"kvscope overhead benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    if args.scale:
        run_scale(256, 256, 200)
        return 0
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    engine = VllmEngine(argv=ARGV)
    engine.start()
    try:
        if args.mfu:
            run_mfu(engine, CASES["decode"], args.rounds)
            return 0
        for name in ("decode", "prefill") if args.case == "both" else (args.case,):
            run_case(engine, CASES[name], args.rounds)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
