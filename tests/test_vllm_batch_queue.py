"""Steps paired with the batch that produced them when vLLM keeps batches in flight.

On CUDA, vLLM's default is async scheduling: the engine core keeps a queue of two batches,
each `step()` schedules batch k and hands out batch k-1's tokens, and the scheduler is
`AsyncScheduler`, which schedules a request's next decode before its last token is known
(output placeholders). The CPU backend turns async scheduling off, so here the session
engine's core is switched onto that same path (`step_with_batch_queue`, a queue of two),
with vLLM's plain `Scheduler` (pipeline parallelism's path) and with vLLM's own
`AsyncScheduler` (CUDA's default); the single-process executor returns finished futures,
so both run, serially, with the same one-batch shift.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from typing import TYPE_CHECKING, Any

import pytest
from engine_hooks import SCHEDULING_MODES, on_step_thread, scheduling, wait_until_drained

from engine.events import (
    ChatMessage,
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.vllm.engine import VllmEngine

pytestmark = pytest.mark.engine


@pytest.fixture(params=["batch-queue", "async"])
def batch_queue_engine(
    vllm_engine: VllmEngine, request: pytest.FixtureRequest
) -> Iterator[VllmEngine]:
    with scheduling(vllm_engine, request.param) as engine:
        yield engine


def record_handouts(engine: VllmEngine) -> tuple[list[dict[str, int]], Any]:
    """vLLM's own count of each batch whose tokens were taken in, in order: the scheduler
    output's `num_scheduled_tokens`, read as `update_from_output` receives it."""
    seen: list[dict[str, int]] = []
    holder: dict[str, Any] = {}

    def wrap(llm_engine: Any) -> None:
        scheduler = llm_engine.engine_core.engine_core.scheduler
        inner = scheduler.update_from_output
        holder["scheduler"], holder["inner"] = scheduler, inner

        def update(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            counts = dict(scheduler_output.num_scheduled_tokens)
            if counts:
                seen.append(counts)
            return inner(scheduler_output, *args, **kwargs)

        scheduler.update_from_output = update

    def unwrap() -> None:
        on_step_thread(
            engine, lambda _e: setattr(holder["scheduler"], "update_from_output", holder["inner"])
        )

    on_step_thread(engine, wrap)
    return seen, unwrap


async def _run(
    engine: VllmEngine, rid: str, prompt: int, out: int
) -> tuple[list[TokenEvent], RequestFinished]:
    request = GenerationRequest(
        rid,
        prompt_token_ids=engine.synthetic_prompt(prompt, seed=zlib.crc32(rid.encode()) % 1000),
        sampling=SamplingSettings(max_tokens=out, ignore_eos=True),
    )
    tokens: list[TokenEvent] = []
    async for event in engine.stream(request):
        if isinstance(event, TokenEvent):
            tokens.append(event)
        elif isinstance(event, RequestFinished):
            return tokens, event
    raise AssertionError("no RequestFinished")


async def test_each_step_is_the_batch_whose_tokens_it_hands_out(
    batch_queue_engine: VllmEngine,
) -> None:
    engine = batch_queue_engine
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    handouts, unwrap = record_handouts(engine)
    try:
        first, second = await asyncio.gather(
            _run(engine, "bq-a", 96, 8), _run(engine, "bq-b", 40, 6)
        )
    finally:
        unwrap()
        remove()
    steps = [s for s in samples if not s.idle]
    by_step = {s.step: s for s in steps}
    # One sample per batch that came back, with vLLM's own counts for that very batch.
    worked = [s for s in steps if s.prefill_tokens + s.decode_tokens > 0]
    assert len(worked) == len(handouts), (len(worked), len(handouts))
    for sample, counts in zip(worked, handouts, strict=True):
        assert sample.prefill_tokens + sample.decode_tokens == sum(counts.values())
        assert sorted(w.request_id for w in sample.work) == sorted(
            rid.rsplit("-", 1)[0] for rid in counts
        )
    for rid, prompt, (tokens, finished) in (("bq-a", 96, first), ("bq-b", 40, second)):
        assert finished.output_tokens == sum(len(t.token_ids) for t in tokens)
        for i, token in enumerate(tokens):
            step = by_step[token.step]
            own = {w.request_id: w for w in step.work}
            assert rid in own, (rid, i, token.step, step.work)
            if i == 0:
                # The first token comes from the batch that ran the prompt's last chunk.
                assert own[rid].prefill_tokens > 0 and own[rid].decode_tokens == 0
            else:
                assert own[rid].decode_tokens == 1 and own[rid].prefill_tokens == 0
        prefilled = sum(w.prefill_tokens for s in steps for w in s.work if w.request_id == rid)
        assert prefilled == prompt - (finished.cached_prompt_tokens or 0)
        anatomy = finished.anatomy
        assert anatomy is not None and finished.ttft_s is not None
        assert anatomy.total_s == pytest.approx(finished.ttft_s, abs=1e-6)
        assert finished.vllm is not None and finished.vllm.ttft_s is not None
        # Counted from when the caller asked, ours can only be the longer one.
        assert finished.ttft_s >= finished.vllm.ttft_s
    # Samples neither overlap nor go back in time.
    for a, b in itertools.pairwise(steps):
        assert b.started_at >= a.started_at + a.duration_s - 1e-9


async def test_the_card_says_how_the_engine_schedules(vllm_engine: VllmEngine) -> None:
    card = vllm_engine.card
    assert card is not None
    assert card.scheduling == "async scheduling off (the CPU backend turns it off)"


async def test_three_requests_at_once_decode_as_decode(batch_queue_engine: VllmEngine) -> None:
    """The issue's own case, shortened: three prompts of different lengths at once. Every
    token after a request's first comes from a step whose work for it is one decode token;
    its prompt is prefill once (what the prefix cache lacked), and nowhere else."""
    engine = batch_queue_engine
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    runs = (("three-a", 100, 8), ("three-b", 150, 8), ("three-c", 32, 8))
    try:
        results = await asyncio.gather(*(_run(engine, *run) for run in runs))
    finally:
        remove()
    by_step = {s.step: s for s in samples if not s.idle}
    for (rid, prompt, out), (tokens, finished) in zip(runs, results, strict=True):
        assert finished.output_tokens == out
        kinds = []
        for token in tokens:
            own = {w.request_id: w for w in by_step[token.step].work}[rid]
            kinds.append((own.prefill_tokens, own.decode_tokens))
        assert kinds[0][0] > 0 and kinds[0][1] == 0, (rid, kinds)
        assert kinds[1:] == [(0, 1)] * (out - 1), (rid, kinds)
        prefilled = sum(
            w.prefill_tokens for s in by_step.values() for w in s.work if w.request_id == rid
        )
        # vLLM's own count of the prompt tokens its prefix cache already held.
        cached = finished.cached_prompt_tokens or 0
        assert prefilled == prompt - cached, (rid, prefilled, cached)


async def _reply_until_it_stops(engine: VllmEngine, rid: str) -> RequestFinished:
    # Greedy, short, and free to stop on the model's own end-of-turn token.
    request = GenerationRequest(
        rid,
        messages=(ChatMessage("user", "Say hello."),),
        sampling=SamplingSettings(max_tokens=48),
    )
    async for event in engine.stream(request):
        if isinstance(event, RequestFinished):
            return event
    raise AssertionError("no RequestFinished")


@pytest.mark.parametrize("mode", SCHEDULING_MODES)
async def test_no_step_spans_the_idle_pause_after_a_reply_that_stopped_on_eos(
    vllm_engine: VllmEngine, mode: str
) -> None:
    """A reply that ends on its own EOS leaves vLLM, with async scheduling, one batch already
    scheduled for it. That batch must not come out after the pause as a step spanning it:
    every step after the pause starts after the next request was sent, and runs its work."""
    samples: list[StepSample] = []
    with scheduling(vllm_engine, mode):
        remove = vllm_engine.add_step_listener(samples.append)
        try:
            first = await _reply_until_it_stops(vllm_engine, f"eos-{mode}")
            ended = len(samples)
            # The batch vLLM had already scheduled for it is taken out at once, not left
            # in vLLM's queue to come out after the pause.
            wait_until_drained(vllm_engine)
            assert first.reason == "stop" and first.output_tokens < 48, first
            longest = max(s.duration_s for s in samples if not s.idle)
            # A pause far longer than any step of the reply: a step that spans it shows.
            pause = max(1.0, 10 * longest)
            await asyncio.sleep(pause)
            after = len(samples)
            sent = time.perf_counter()
            _tokens, second = await _run(vllm_engine, f"after-eos-{mode}", 16, 3)
        finally:
            remove()
    later = [s for s in samples[after:] if not s.idle]
    assert later and second.output_tokens == 3
    for s in later:
        assert s.started_at >= sent, (s, sent)
        assert s.duration_s < pause, (s, pause)
        assert [w.request_id for w in s.work] == [f"after-eos-{mode}"], s
    # Between the reply's end and the next request, no step with work came out at all.
    assert all(s.idle for s in samples[ended:after]), samples[ended:after]
