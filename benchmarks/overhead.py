"""Benchmark (not a test): what kvscope's step loop costs on top of a bare vLLM loop.

One warm in-process engine, two ways, in alternating rounds so host noise hits both:
  bare     add_request() + step() until done, run on kvscope's own step thread
  kvscope  the same requests through VllmEngine.stream(): events, samples, hand-off
Cases (from issue 12):
  decode   8 prompts of 32 tokens -> 256 output tokens each
  prefill  2,048-token prompts -> 8 output tokens
It prints each round's throughput ratio (kvscope / bare; 1.00 = no cost), the median, and
how busy the host was during each round. Then where the time went (issue 30): every piece of
code the step thread runs is timed as a span (vLLM's step(), kvscope's step bookkeeping, the
token events, the hand-off to the consumer's loop, admitting requests, idle waits; see
`Timeline` and `attribute`), each part the duration of its own code, so none is ever
negative and together they make up each round's wall time. The table gives each part for
both kinds of round and their difference, which adds up to the whole gap; beside it, the
consumer's CPU (the asyncio side, which takes a core and the GIL from the step) and how
long a hand-off took to reach the consumer's loop.

    .venv/bin/python benchmarks/overhead.py [--rounds 3] [--case decode|prefill|both]
    .venv/bin/python benchmarks/overhead.py --scale    # 256 requests, no engine: see below
    .venv/bin/python benchmarks/overhead.py --mfu      # vLLM's FLOP/byte count on vs off

--scale: kvscope's costs at GPU scale without an engine: the block IDs of 256 requests x 256
blocks each step, and the per-token path (the real outbox, `_hand_out` and `stream()`, 256
streams read on one asyncio loop, a 25 ms step), per token, per step and as % of the step.

--mfu (issue 32): kvscope turns on vLLM's `--enable-mfu-metrics` by default, so each step
also runs `ModelMetrics.get_step_perf_stats_per_gpu` in the scheduler. The same warm engine
runs the decode case with the scheduler's `perf_metrics` set and unset, in alternating
rounds, and times the count itself inside each step.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import HostLoad
from engine.events import GenerationRequest, RequestFinished, SamplingSettings, TokenEvent

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
    """--mfu's timer of the FLOP count inside each step."""

    step_s: float = 0.0
    steps: int = 0


@dataclass(slots=True)
class Span:
    """One run of a named piece of code on the step thread."""

    kind: str
    began: float
    ended: float
    own_s: float  # its wall time less that of the spans nested in it
    own_cpu_s: float  # the thread's CPU time in it, less the nested spans'
    depth: int  # 0: called by the step loop itself


class Timeline:
    """Spans of named code on the step thread. A nested span's time is taken out of its
    parent's own time, so every part is the duration of some code (never the difference of
    two noisy totals), none is negative, and the parts of a stretch of time add up to it."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._open: list[list[float]] = []  # per open span: its children's [wall, CPU]

    def timed(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spans, open_ = self.spans, self._open
        clock, cpu = time.perf_counter, time.thread_time

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            inner = [0.0, 0.0]
            depth = len(open_)
            open_.append(inner)
            # CPU read outside the wall reads: a parent's CPU window holds its children's.
            c0 = cpu()
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = clock()
                c1 = cpu()
                open_.pop()
                wall, used = t1 - t0, c1 - c0
                if open_:
                    open_[-1][0] += wall
                    open_[-1][1] += used
                spans.append(Span(kind, t0, t1, wall - inner[0], used - inner[1], depth))

        return timed_call


# The parts of a round on the step thread, in the table's order: (key, words).
PARTS = (
    ("step", "vLLM's step()"),
    ("loop", "step loop between calls (has_unfinished_requests, command queue)"),
    ("add", "admitting requests (SamplingParams, add_request)"),
    ("book", "step bookkeeping (scheduled work, block IDs, StepSample, listeners)"),
    ("tokens", "token events, one a request a step (RequestTimes, TokenEvent, outbox)"),
    ("handoff", "hand-off to the consumer's loop (call_soon_threadsafe, once a step)"),
    ("first", "idle before the first request reaches the step thread"),
    ("between", "idle between requests (the consumer's round trip)"),
    ("last", "idle until the consumer has read the last step"),
)
KVSCOPE_ONLY = ("book", "tokens", "handoff")
_OWN_PART = {
    "step": "step",
    "drain": "loop",
    "add": "add",
    "bare_add": "add",
    "one_step": "book",
    "hand_out": "tokens",
    "flush": "handoff",
}


@dataclass
class Attribution:
    """Where one kind of round's wall time went on the step thread, summed over rounds."""

    parts: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k, _ in PARTS})
    off_cpu: dict[str, float] = field(default_factory=dict)  # wall less the thread's CPU
    wall_s: float = 0.0
    steps: int = 0
    spans: int = 0
    consumer_cpu_s: float = 0.0  # the asyncio side (the main thread) over its rounds
    tokens: int = 0

    def add(self, other: Attribution) -> None:
        for k, v in other.parts.items():
            self.parts[k] += v
        for k, v in other.off_cpu.items():
            self.off_cpu[k] = self.off_cpu.get(k, 0.0) + v
        self.wall_s += other.wall_s
        self.steps += other.steps
        self.spans += other.spans
        self.consumer_cpu_s += other.consumer_cpu_s
        self.tokens += other.tokens


def attribute(spans: list[Span], began: float, ended: float) -> Attribution:
    """Split the step thread's time from `began` to `ended` (a round, on the caller's
    clock) into PARTS, each a sum of spans' own times. A blocking wait for a command
    ("wait") is clipped to the round: the step thread idled before it began and after it
    ended. Anything else that began in the round counts whole, so the round reaches to
    the end of the last such span when that ends later (a step whose tokens the consumer
    read before its bookkeeping returned). Step-thread time in no span is the step loop's
    own code between calls ("loop"). Every part is >= 0 and together they are the
    round's wall time."""
    out = Attribution()
    taken = [s for s in spans if s.ended > began and s.began < ended]
    steps = [s for s in taken if s.kind == "step"]
    first = min((s.began for s in steps), default=ended)
    last = max((s.ended for s in steps), default=began)
    end = max([ended] + [s.ended for s in taken if s.kind != "wait"])
    # The outermost spans of the round: the bare loop runs inside a command's call, itself
    # inside a wait that has not ended yet when its round is read.
    top = min((s.depth for s in taken), default=0)
    covered = 0.0
    for s in taken:
        if s.kind == "wait":
            wall = min(s.ended, ended) - max(s.began, began)
            children = (s.ended - s.began) - s.own_s
            own = max(0.0, wall - children)
            cpu = min(s.own_cpu_s, own)
            key = "first" if s.ended <= first else "last" if s.began >= last else "between"
        else:
            wall = s.ended - s.began
            own, cpu, key = s.own_s, s.own_cpu_s, _OWN_PART[s.kind]
        if s.depth == top:
            covered += wall
        out.parts[key] += own
        out.off_cpu[key] = out.off_cpu.get(key, 0.0) + max(0.0, own - cpu)
    out.parts["loop"] += max(0.0, (end - began) - covered)
    out.wall_s = end - began
    out.steps = len(steps)
    out.spans = len(taken)
    return out


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


def bare_round(
    engine: Any, prompts: list[tuple[int, ...]], case: Case, timeline: Timeline | None = None
) -> tuple[float, int, Attribution]:
    def run(llm: Any) -> tuple[float, int, Attribution]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        # The very parameters kvscope's `_add` makes of the same SamplingSettings: greedy
        # (temperature 0). vLLM's default of 1.0 samples from the whole vocabulary each
        # token, a heavier step, and made the bare loop read about 12 % slower than
        # kvscope's (issue 30).
        sp = SamplingSettings(max_tokens=case.output_len, ignore_eos=True)
        params = SamplingParams(
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            ignore_eos=sp.ignore_eos,
            seed=sp.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        add = timeline.timed("bare_add", llm.add_request) if timeline else llm.add_request
        tokens = 0
        started = time.perf_counter()
        batches = [prompts] if case.concurrent else [[p] for p in prompts]
        for n, batch in enumerate(batches):
            for i, ids in enumerate(batch):
                add(
                    f"bare-{time.monotonic_ns()}-{n}-{i}",
                    TokensPrompt(prompt_token_ids=list(ids)),  # type: ignore[typeddict-item]
                    params,
                )
            while llm.has_unfinished_requests():
                for out in llm.step():
                    tokens += len(out.outputs[0].token_ids) if out.outputs else 0
        ended = time.perf_counter()
        engine._introspector.take_scheduled()  # leave no stale step summary behind
        parts = attribute(timeline.spans, started, ended) if timeline else Attribution()
        return ended - started, tokens, parts

    result: tuple[float, int, Attribution] = on_step_thread(engine, run)
    return result


async def kvscope_round(
    engine: Any, prompts: list[tuple[int, ...]], case: Case
) -> tuple[float, int, float, float]:
    """(wall, tokens, started, consumer CPU): the consumer is this thread's event loop."""
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

    # Every real user of the engine listens to its steps (the UI, bench's StepView, a tape):
    # kvscope's rounds keep theirs as bench does, so the samples' cost counts.
    samples: list[Any] = []
    remove = engine.add_step_listener(samples.append)
    cpu = time.thread_time()
    started = time.perf_counter()
    try:
        if case.concurrent:
            counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        else:
            counts = [await one(i, p) for i, p in enumerate(prompts)]
    finally:
        remove()
    return time.perf_counter() - started, sum(counts), started, time.thread_time() - cpu


@dataclass
class Installed:
    """The timers put on one engine: wrapping its methods twice would count twice."""

    engine_id: int
    timeline: Timeline
    handed: collections.deque[float]  # when each hand-off was made, until it arrives
    latencies: list[float]  # hand-off made -> its batch delivered on the consumer's loop


INSTALLED: Installed | None = None


def instrument(engine: Any) -> Installed:
    """Time the step thread's code (see Timeline) and each hand-off's trip to the consumer."""
    global INSTALLED
    if INSTALLED is not None and INSTALLED.engine_id == id(engine):
        return INSTALLED
    import engine.vllm.engine as module

    timeline = Timeline()
    handed: collections.deque[float] = collections.deque()
    latencies: list[float] = []

    def patch(llm: Any) -> None:
        llm.step = timeline.timed("step", llm.step)

    on_step_thread(engine, patch)
    engine._one_step = timeline.timed("one_step", engine._one_step)
    engine._hand_out = timeline.timed("hand_out", engine._hand_out)
    engine._add = timeline.timed("add", engine._add)
    drain = engine._drain
    blocking = timeline.timed("wait", drain)
    polling = timeline.timed("drain", drain)

    def timed_drain(llm: Any, *, block: bool) -> None:
        (blocking if block else polling)(llm, block=block)

    engine._drain = timed_drain
    outbox = engine._outbox
    flush = timeline.timed("flush", outbox.flush)

    def noted_flush() -> None:
        if outbox._by_loop:  # a flush with nothing in it hands nothing over
            handed.append(time.perf_counter())
        flush()

    outbox.flush = noted_flush
    deliver = module._deliver

    def timed_deliver(batch: Any) -> None:
        if handed:
            latencies.append(time.perf_counter() - handed.popleft())
        deliver(batch)

    module._deliver = timed_deliver
    INSTALLED = Installed(id(engine), timeline, handed, latencies)
    return INSTALLED


def span_cost() -> float:
    """What one Timeline span costs its thread, so the table can say how much of the
    kvscope side is this benchmark's own timers."""
    timeline = Timeline()
    noop = timeline.timed("x", lambda: None)
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):
        noop()
    return (time.perf_counter() - t) / n


def run_case(engine: Any, case: Case, rounds: int) -> None:
    prompts = [engine.synthetic_prompt(case.prompt_len, seed=1000 + i) for i in range(case.prompts)]
    # Warm-up, both ways, so neither pays first-use costs.
    warm = Case(case.name, 1, case.prompt_len, 8, False)
    bare_round(engine, prompts[:1], warm)
    asyncio.run(kvscope_round(engine, prompts[:1], warm))
    timers = instrument(engine)
    timeline = timers.timeline
    print(f"\n{case.name}: {case.prompts} x {case.prompt_len}-token prompts", end="")
    print(f" -> {case.output_len} tokens")
    head = f"{'round':>5}  {'bare tok/s':>10}  {'kvscope tok/s':>13}  {'ratio':>6}"
    print(head + "  host (bare | kvscope)")
    ratios = []
    sums = {"bare": Attribution(), "kvscope": Attribution()}
    timers.latencies.clear()
    for r in range(rounds):
        # Alternate which goes first, so a trend in host load does not favour either.
        order = ("bare", "kvscope") if r % 2 == 0 else ("kvscope", "bare")
        rates: dict[str, float] = {}
        notes: dict[str, str] = {}
        for who in order:
            timeline.spans.clear()
            timers.handed.clear()
            load = HostLoad().start()
            if who == "bare":
                cpu = time.thread_time()  # this thread only waits for the step thread
                elapsed, tokens, parts = bare_round(engine, prompts, case, timeline)
                parts.consumer_cpu_s = time.thread_time() - cpu
            else:
                elapsed, tokens, started, consumer = asyncio.run(
                    kvscope_round(engine, prompts, case)
                )
                on_step_thread(engine, lambda _llm: None)  # the round's last step returned
                parts = attribute(timeline.spans, started, started + elapsed)
                parts.consumer_cpu_s = consumer
            parts.tokens = tokens
            sums[who].add(parts)
            rates[who] = tokens / elapsed
            notes[who] = load.note()
        ratio = rates["kvscope"] / rates["bare"]
        ratios.append(ratio)
        print(
            f"{r + 1:>5}  {rates['bare']:>10.1f}  {rates['kvscope']:>13.1f}  {ratio:>6.3f}  "
            f"{notes['bare']} | {notes['kvscope']}"
        )
    print(f"median ratio (kvscope / bare): {statistics.median(ratios):.3f}")
    print_attribution(sums["bare"], sums["kvscope"], timers.latencies, span_cost())


def print_attribution(
    bare: Attribution, kv: Attribution, latencies: list[float], span_s: float
) -> None:
    """The table: each part of both rounds' wall time on the step thread, in ms a step of
    the bare loop (the same work), and kvscope's minus the bare loop's as % of vLLM's step
    there. The differences add up to the whole gap, every part of it named."""
    steps = max(bare.steps, 1)
    vllm_step = bare.parts["step"] / steps
    print(
        f"\nwhere the step thread's time went, ms a step ({bare.steps} steps bare, "
        f"{kv.steps} through kvscope, over all rounds; % of vLLM's bare step, "
        f"{vllm_step * 1e3:.2f} ms)"
    )
    print(f"{'part':<78}{'bare':>8}{'kvscope':>9}{'diff':>8}{'%':>8}")

    def row(words: str, b: float, k: float) -> None:
        d = (k - b) / steps
        share = d / vllm_step if vllm_step else 0.0
        ms = f"{b / steps * 1e3:>8.3f}{k / steps * 1e3:>9.3f}{d * 1e3:>8.3f}"
        print(f"{words:<78}{ms}{share:>8.2%}")

    for key, words in PARTS:
        row(words, bare.parts[key], kv.parts[key])
        if key == "step":
            row(
                "  of which off the CPU (the GIL, or a core taken)",
                bare.off_cpu.get(key, 0.0),
                kv.off_cpu.get(key, 0.0),
            )
    row("round wall time, all parts", bare.wall_s, kv.wall_s)
    own = sum(kv.parts[k] for k in KVSCOPE_ONLY)
    off = sum(kv.off_cpu.get(k, 0.0) for k in KVSCOPE_ONLY)
    print(
        f"kvscope's own code on the step thread: {own / steps * 1e3:.3f} ms a step "
        f"= {own / steps / vllm_step:.2%} of vLLM's step (of which off the CPU, waiting for "
        f"the GIL or a core: {off / steps * 1e3:.3f} ms; this benchmark's timers: about "
        f"{kv.spans * span_s / steps * 1e3:.3f} ms)"
    )
    print(
        "the consumer (the asyncio side) in the same rounds: "
        f"{kv.consumer_cpu_s / steps * 1e3:.3f} ms of CPU a step, "
        f"{kv.consumer_cpu_s / max(kv.tokens, 1) * 1e6:.1f} µs a token "
        f"(bare loop's waiting thread: {bare.consumer_cpu_s / steps * 1e3:.3f} ms); it runs "
        "beside the step and takes a core and the GIL from it: it shows in vLLM's step() row"
    )
    if latencies:
        lat = sorted(latencies)
        print(
            f"hand-off made -> delivered on the consumer's loop: median "
            f"{lat[len(lat) // 2] * 1e3:.3f} ms, p90 {lat[int(len(lat) * 0.9)] * 1e3:.3f} ms "
            f"over {len(lat)} hand-offs"
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
            elapsed, tokens, _, _ = asyncio.run(kvscope_round(engine, prompts, case))
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
    step_s, python_s = 0.025, 0.002
    on_thread, consumer, trip, waited = run_scale_tokens(requests, 120, step_s, python_s)
    for who, per_token in (
        ("step thread, token events and hand-off (_hand_out)", on_thread),
        ("consumer, reading them through stream()", consumer),
    ):
        per_step = per_token * requests
        print(
            f"scale, {who}: {per_token * 1e6:.1f} µs of CPU a token = {per_step * 1e3:.2f} ms a "
            f"step of {requests} tokens = {per_step / step_s:.1%} of a {step_s * 1e3:.0f} ms step"
        )
    print(f"scale, hand-off made -> delivered on the consumer's loop: median {trip * 1e3:.3f} ms")
    print(
        f"scale, the step thread off the CPU in vLLM's Python ({python_s * 1e3:.0f} ms before "
        f"and after the device's part, GIL held): median {waited * 1e3:.3f} ms a step "
        f"= {waited / step_s:.1%} of the step (the GIL the consumer holds, or a core taken)"
    )


class _Completion:
    __slots__ = ("finish_reason", "text", "token_ids")

    def __init__(self, token: int, finished: bool) -> None:
        self.token_ids = [token]
        self.text = " x"
        self.finish_reason = "length" if finished else None


class _Output:
    """What vLLM's step() returns for one request (a RequestOutput, DELTA kind)."""

    __slots__ = ("finished", "num_cached_tokens", "outputs", "request_id")

    def __init__(self, request_id: str, token: int, finished: bool) -> None:
        self.request_id = request_id
        self.outputs = [_Completion(token, finished)]
        self.num_cached_tokens = 0
        self.finished = finished


def run_scale_tokens(
    requests: int, steps: int, step_s: float, python_s: float
) -> tuple[float, float, float, float]:
    """Per-token costs at GPU scale, no engine: a VllmEngine's own `stream()`, outbox and
    `_hand_out`, with `requests` streams read on one asyncio loop, and a step thread whose
    vLLM step is `step_s` long: `python_s` of Python (GIL held) before and after a sleep (a
    GPU step waits on the device). Returns the step thread's and the consumer's CPU a
    token, the hand-off's median trip, and the step thread's time off the CPU in its Python
    a step (waiting for the GIL the consumer holds, or for a core)."""
    import types

    from engine.vllm.engine import VllmEngine

    engine: Any = VllmEngine(argv=[])
    engine._card = types.SimpleNamespace(max_model_len=1 << 20)
    engine._introspector = types.SimpleNamespace(
        num_running=lambda: 0,
        num_waiting=lambda: 0,
        usage=lambda: 0.0,
        free_blocks=lambda: 1,
        total_blocks=1,
        block_size=16,
        block_cache=lambda: None,
    )
    hand_out: list[float] = []  # the step thread's CPU in `_hand_out`, a step
    waited: list[float] = []  # the step thread off the CPU in vLLM's Python, a step

    def python(cpu_s: float) -> None:
        t = time.perf_counter()
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass
        waited.append(time.perf_counter() - t - cpu_s)

    handed: list[float] = []
    arrived: list[float] = []
    import engine.vllm.engine as module

    deliver = module._deliver

    def timed_deliver(batch: Any) -> None:
        arrived.append(time.perf_counter())
        deliver(batch)

    def step_loop() -> None:
        live: list[Any] = []
        while len(live) < requests:
            _kind, one = engine._commands.get()
            engine._book.add(one)
            engine._outbox.put(one, one.accepted())
            live.append(one)
        engine._outbox.flush()
        for step in range(steps):
            # vLLM's step: its Python (scheduling this batch, then taking in the last
            # one's outputs) holds the GIL; the GPU's part does not. A consumer that holds
            # the GIL when the Python wants it shows here as time off the CPU.
            python(python_s)
            time.sleep(step_s - 2 * python_s)
            python(python_s)
            last = step == steps - 1
            outputs = [_Output(x.request_id, step, last) for x in live]  # vLLM's work
            c0 = time.thread_time()
            t0 = time.perf_counter()
            handed.append(t0)
            engine._hand_out(None, outputs, t0)
            hand_out.append(time.thread_time() - c0)

    async def consume() -> tuple[float, int]:
        sampling = SamplingSettings(max_tokens=steps, ignore_eos=True)

        async def one(i: int) -> int:
            n = 0
            req = GenerationRequest(f"s{i}", prompt_token_ids=(1, 2, 3), sampling=sampling)
            async for event in engine.stream(req):
                n += isinstance(event, TokenEvent)
            return n

        cpu = time.thread_time()
        counts = await asyncio.gather(*(one(i) for i in range(requests)))
        return time.thread_time() - cpu, sum(counts)

    module._deliver = timed_deliver
    thread = threading.Thread(target=step_loop, name="kvscope-engine")
    engine._thread = thread
    thread.start()
    try:
        consumer_cpu, tokens = asyncio.run(consume())
    finally:
        thread.join()
        module._deliver = deliver
    trips = sorted(b - a for a, b in zip(handed, arrived[1:], strict=False))
    step_cpu = sum(hand_out) / max(tokens, 1)
    trip = trips[len(trips) // 2] if trips else 0.0
    per_step = [a + b for a, b in zip(waited[::2], waited[1::2], strict=False)]
    off_cpu = statistics.median(per_step) if per_step else 0.0
    return step_cpu, consumer_cpu / max(tokens, 1), trip, off_cpu


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


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU model unknown"


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--case", choices=("decode", "prefill", "both"), default="both")
    p.add_argument("--scale", action="store_true", help="only the GPU-scale bookkeeping check")
    p.add_argument("--mfu", action="store_true", help="vLLM's FLOP/byte count on vs off (decode)")
    args = p.parse_args()
    print(
        f"kvscope overhead benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {cpu_model()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    if args.scale:
        run_scale(256, 256, 200)
        return 0
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    engine = VllmEngine(argv=ARGV)
    engine.start()
    threads = on_step_thread(engine, lambda _llm: _torch_threads())
    print(f"torch runs vLLM's step on {threads} threads")
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
