"""Steps paired with the batch that produced them when vLLM keeps batches in flight.

On CUDA, vLLM's default is async scheduling: the engine core keeps a queue of two batches,
and each `step()` schedules batch k and hands out batch k-1's tokens. The CPU backend turns
async scheduling off, so here the session engine's core is switched onto that same path
(`step_with_batch_queue`, a queue of two); the single-process executor returns finished
futures, so it runs, serially, with the same one-batch shift.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import pytest
from engine_hooks import on_step_thread, set_batch_queue

from engine.events import (
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


@pytest.fixture
def batch_queue_engine(vllm_engine: VllmEngine) -> Iterator[VllmEngine]:
    set_batch_queue(vllm_engine, 2)
    try:
        yield vllm_engine
    finally:
        set_batch_queue(vllm_engine, 1)


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
        prompt_token_ids=engine.synthetic_prompt(prompt, seed=hash(rid) % 1000),
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
        assert sum(w.prefill_tokens for s in steps for w in s.work if w.request_id == rid) == prompt
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
