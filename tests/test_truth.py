"""kvscope's numbers against vLLM's own, for the very same requests, in one process.

vLLM keeps its own per-request figures (its TTFT from its arrival time, and inter-token
latencies from the engine core's timestamps); kvscope reports them beside its own in
`RequestFinished.vllm`. These tests hold kvscope to them: the same ITLs within 0.5 ms, and a
TTFT never shorter than vLLM's, since kvscope's clock starts earlier, when the caller asks.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest
from engine_hooks import SCHEDULING_MODES, PoolHeld, on_step_thread, scheduling

from engine.events import (
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    StepSample,
    StepStarted,
    TokenEvent,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from engine.protocol import Engine
    from engine.vllm.engine import VllmEngine

ITL_TOLERANCE_S = 0.5e-3


@contextmanager
def step_budget(engine: VllmEngine, tokens: int) -> Iterator[None]:
    """The session engine's per-step token budget set to `tokens` (chunked prefill is on,
    vLLM's default here), and given back on exit: a second engine for a smaller budget
    would cost its own process and start-up (tens of seconds)."""
    # Asked here, not on the step thread: a failed assert there would end the engine.
    assert engine.introspection.vllm_config.scheduler_config.enable_chunked_prefill
    saved: list[int] = []

    def set_to(value: int) -> Any:
        def switch(llm_engine: Any) -> None:
            scheduler = llm_engine.engine_core.engine_core.scheduler
            saved.append(scheduler.max_num_scheduled_tokens)
            scheduler.max_num_scheduled_tokens = value
            # What kvscope reads to number a prompt's chunks (engine/vllm/internals.py).
            scheduler.scheduler_config.max_num_batched_tokens = value

        return switch

    on_step_thread(engine, set_to(tokens))
    try:
        yield
    finally:
        on_step_thread(engine, set_to(saved[0]))


async def _run(engine: Engine, rid: str, n: int, max_tokens: int, seed: int) -> RequestFinished:
    ids = engine.synthetic_prompt(n, seed=seed)
    request = GenerationRequest(
        rid, prompt_token_ids=ids, sampling=SamplingSettings(max_tokens=max_tokens, ignore_eos=True)
    )
    last = None
    async for event in engine.stream(request):
        last = event
    assert isinstance(last, RequestFinished)
    return last


def _check(done: RequestFinished) -> float:
    """The request's median |ΔITL| against vLLM's; asserts the TTFT rule on the way. A
    failure prints every gap (`_said`): both stamps are taken on the step thread, vLLM's
    when its engine core builds the step's outputs (EngineCoreOutputs.timestamp) and
    kvscope's when step() returns, after vLLM's output processing, so a host busier than
    its cores (two busy loops beside the suite, fresh clone O) can preempt the thread
    between them and move a gap by a time slice."""
    theirs = done.vllm
    assert theirs is not None, "vLLM's own figures are missing"
    assert done.ttft_s is not None
    assert theirs.ttft_s is not None
    # vLLM's clock starts when the step thread hands it the request; ours starts earlier.
    assert done.ttft_s >= theirs.ttft_s - ITL_TOLERANCE_S, (done.ttft_s, theirs.ttft_s)
    assert len(theirs.itl_s) == len(done.itl_s) == done.output_tokens - 1
    return statistics.median(abs(a - b) for a, b in zip(done.itl_s, theirs.itl_s, strict=True))


def _said(done: RequestFinished) -> str:
    """Each gap, kvscope's and vLLM's in ms, and the host's load: what a failure needs."""
    theirs = done.vllm.itl_s if done.vllm is not None else ()
    pairs = zip(done.itl_s, theirs, strict=False)
    gaps = ", ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}" for a, b in pairs)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{done.request_id}: ITLs kvscope/vLLM ms: {gaps}; load {load}, {os.cpu_count()} cores"


async def test_single_request_agrees_with_vllm(vllm_engine: Engine) -> None:
    await _run(vllm_engine, "truth-warm", 64, 4, seed=300)
    done = await _run(vllm_engine, "truth-single", 256, 24, seed=301)
    assert _check(done) < ITL_TOLERANCE_S, _said(done)


async def test_concurrent_requests_agree_with_vllm(vllm_engine: Engine) -> None:
    results = await asyncio.gather(
        *(_run(vllm_engine, f"truth-conc-{i}", 128 + 64 * i, 16, seed=310 + i) for i in range(4))
    )
    for done in results:
        assert _check(done) < ITL_TOLERANCE_S, _said(done)


async def test_a_request_sent_during_a_long_prefill_counts_its_wait(vllm_engine: Engine) -> None:
    """The short request waits in kvscope's queue while the long prefill's step runs: that
    wait is part of what its caller sees, so it is part of its TTFT."""
    starts = vllm_engine.features.step_starts
    assert starts is not None
    prefilling = threading.Event()

    def began(step: StepStarted) -> None:
        if any(chunk.request_id == "truth-long" for chunk in step.chunks):
            prefilling.set()

    remove = starts.add_step_start_listener(began)
    try:
        long_task = asyncio.create_task(_run(vllm_engine, "truth-long", 1024, 2, seed=320))
        # Sent once the long prompt's step is running (the engine says so), not after a
        # guess at how long the queue takes on this machine.
        assert await _until(prefilling.is_set, 120), "the long prompt's step never began"
        short = await _run(vllm_engine, "truth-short", 64, 8, seed=321)
        long = await long_task
    finally:
        remove()
    assert long.ttft_s is not None
    assert short.vllm is not None
    assert short.ttft_s is not None
    assert short.vllm.ttft_s is not None
    # It waited for a step that was running when it came, and no longer than the long
    # request took to its first token.
    assert 0 < short.vllm.kvscope_queue_s <= long.ttft_s, (short.vllm, long.ttft_s)
    assert short.ttft_s >= short.vllm.ttft_s
    # Ours includes the wait; vLLM's starts after it.
    assert short.ttft_s - short.vllm.ttft_s == pytest.approx(short.vllm.kvscope_queue_s, abs=0.01)
    assert _check(short) < ITL_TOLERANCE_S, _said(short)


async def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `done()` came true within `timeout_s`, looking every 10 ms (a hang guard)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_the_last_request_ending_leaves_an_idle_sample(vllm_engine: Engine) -> None:
    samples: list[StepSample] = []
    remove = vllm_engine.add_step_listener(samples.append)
    try:
        await _run(vllm_engine, "truth-idle", 200, 4, seed=330)
        # The step thread emits it right after the last event (a hang guard, not a speed).
        await _until(lambda: bool(samples) and samples[-1].idle, 60)
    finally:
        remove()
    last = samples[-1]
    assert last.idle
    assert last.running == 0
    assert last.waiting == 0
    assert last.free_blocks == last.total_blocks
    assert not last.blocks


@pytest.mark.parametrize("mode", SCHEDULING_MODES)
async def test_ttft_anatomy_adds_up_and_counts_prefill_chunks(
    vllm_engine: VllmEngine, mode: str
) -> None:
    """With a 128-token step budget a 512-token prompt takes 4 prefill chunks; the parts
    of its TTFT add up to the TTFT measured from the caller's clock."""
    # A prompt of its own in each mode: one the prefix cache holds would not be prefilled.
    seed = 340 + SCHEDULING_MODES.index(mode)
    with scheduling(vllm_engine, mode), step_budget(vllm_engine, 128):
        done = await _run(vllm_engine, f"anatomy-{mode}", 512, 2, seed=seed)
    parts = done.anatomy
    assert parts is not None
    assert done.ttft_s is not None
    assert parts.chunks == 4, parts
    assert parts.total_s == pytest.approx(done.ttft_s, abs=1e-6)
    assert parts.prefill_s > parts.queue_s


# Not with the plain `Scheduler` in a batch queue: there a decoder's next token waits for
# its last one, so every other batch is the newcomer's prefill alone, never both.
@pytest.mark.parametrize("mode", ["lockstep", "async"])
async def test_a_decoders_spike_is_another_requests_prefill(
    vllm_engine: VllmEngine, mode: str
) -> None:
    """One long prompt arrives while another request decodes: the step where the decoder's
    token waited also ran the newcomer's prefill chunk, and the step sample says so."""
    with scheduling(vllm_engine, mode) as engine:
        await _spike_seen(engine, mode)


async def _spike_seen(engine: VllmEngine, mode: str) -> None:
    samples: list[StepSample] = []
    seed = 350 + 10 * SCHEDULING_MODES.index(mode)
    decoding = asyncio.Event()

    async def decode() -> RequestFinished:
        ids = engine.synthetic_prompt(16, seed=seed)
        request = GenerationRequest(
            f"spike-decoder-{mode}",
            prompt_token_ids=ids,
            sampling=SamplingSettings(max_tokens=40, ignore_eos=True),
        )
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent):
                decoding.set()  # its first token: it decodes from the next step on
            if isinstance(event, RequestFinished):
                return event
        raise AssertionError("the decoder never finished")

    remove = engine.add_step_listener(samples.append)
    try:
        decoder = asyncio.create_task(decode())
        # Sent once the decoder decodes (not after a time, which a slow prefill outlasts).
        await asyncio.wait_for(decoding.wait(), timeout=300)
        long = await _run(engine, f"spike-long-{mode}", 384, 2, seed=seed + 1)
        dec = await decoder
    finally:
        remove()
    worst = max(range(len(dec.itl_s)), key=lambda i: dec.itl_s[i])
    # The step that made the decoder's slowest token:
    by_step = {s.step: s for s in samples}
    spiky = [
        s
        for s in samples
        if any(w.request_id == f"spike-decoder-{mode}" and w.decode_tokens for w in s.work)
        and any(w.request_id == f"spike-long-{mode}" and w.prefill_tokens for w in s.work)
    ]
    assert spiky, "no step ran the decoder beside the long prefill"
    assert dec.itl_s[worst] >= max(s.duration_s for s in spiky) * 0.9
    assert by_step  # the samples carried per-request work
    # The long request shared its prefill steps with the decoder: some of its TTFT is the
    # decoder's, and the parts still add up to the whole.
    parts = long.anatomy
    assert parts is not None
    assert long.ttft_s is not None
    assert parts.others_s > 0
    assert parts.total_s == pytest.approx(long.ttft_s, abs=1e-6)


async def test_preemption_is_seen_and_its_recompute_counts_as_prefill(
    vllm_engine: VllmEngine,
) -> None:
    """More copies than the pool holds: vLLM preempts one, and when it comes back its
    recompute of prompt *and* earlier output is prefill work in the step samples."""
    card = vllm_engine.card
    assert card is not None
    samples: list[StepSample] = []
    remove = vllm_engine.add_step_listener(samples.append)
    # Four free blocks; three copies of 3/4 of a block that each end at 1.25 blocks: 6
    # blocks wanted of 4, so one is evicted once they outgrow their first block (output
    # past that only adds decode steps).
    quarter = card.block_size // 4
    try:
        with PoolHeld(vllm_engine, keep_free=4):
            results = await asyncio.gather(
                *(
                    _run(vllm_engine, f"pre-{i}", 3 * quarter, 2 * quarter, seed=360 + i)
                    for i in range(3)
                )
            )
    finally:
        remove()
    assert sum(r.preemptions for r in results) > 0
    preempted_at = {
        rid: s.step for s in samples for rid in s.preempted_ids if rid.startswith("pre-")
    }
    assert preempted_at
    rid, step = next(iter(preempted_at.items()))
    # Scheduled again after the preemption, it recomputes its prompt (what the prefix
    # cache no longer holds) and the output it had made: all of it prefill, none decode.
    back = [
        w
        for s in samples
        if s.step > step
        for w in s.work
        if w.request_id == rid and w.prefill_tokens
    ]
    assert back
    assert back[0].decode_tokens == 0
    assert back[0].prefill_tokens > 1
