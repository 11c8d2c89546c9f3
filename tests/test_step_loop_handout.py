"""The real engine's step loop does per step only what the step needs (issue 30): a step
whose requests all have their first token books no TTFT anatomy, a decode step hands out
the same RequestWork it handed out last step, and `stream()` starts its clock when called."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest
from engine_hooks import on_step_thread

from engine.events import (
    GenerationRequest,
    RequestAccepted,
    RequestFinished,
    RequestWork,
    SamplingSettings,
    StepSample,
)

if TYPE_CHECKING:
    from engine.vllm.engine import VllmEngine

pytestmark = pytest.mark.engine


async def _run(engine: VllmEngine, rid: str, prompt: int, out: int, seed: int) -> RequestFinished:
    ids = engine.synthetic_prompt(prompt, seed=seed)
    request = GenerationRequest(
        rid, prompt_token_ids=ids, sampling=SamplingSettings(max_tokens=out, ignore_eos=True)
    )
    last = None
    async for event in engine.stream(request):
        last = event
    assert isinstance(last, RequestFinished)
    return last


async def test_steps_after_the_first_token_book_no_ttft_anatomy(vllm_engine: VllmEngine) -> None:
    calls: list[int] = []
    book = vllm_engine._book
    inner = book.book_step

    def counted(*args: Any) -> None:
        calls.append(1)
        inner(*args)

    on_step_thread(vllm_engine, lambda _e: setattr(book, "book_step", counted))
    try:
        done = await _run(vllm_engine, "anatomy-once", 24, 6, seed=901)
    finally:
        on_step_thread(vllm_engine, lambda _e: book.__dict__.pop("book_step", None))
    # The prompt is one step's work: that step made the first token, and the five decode
    # steps after it had nothing to book.
    assert len(calls) == 1
    assert done.anatomy is not None
    assert done.ttft_s is not None
    assert done.anatomy.total_s == pytest.approx(done.ttft_s, abs=1e-6)


async def test_a_decode_step_hands_out_last_steps_request_work(vllm_engine: VllmEngine) -> None:
    samples: list[StepSample] = []
    remove = vllm_engine.add_step_listener(samples.append)
    try:
        await _run(vllm_engine, "work-reused", 20, 5, seed=902)
    finally:
        remove()
    works = [w for s in samples for w in s.work if w.request_id == "work-reused"]
    # Its prompt, then four decodes: the values as a fresh RequestWork would have them.
    assert works == [RequestWork("work-reused", 20, 0)] + [RequestWork("work-reused", 0, 1)] * 4
    assert all(w is works[1] for w in works[1:])  # one object, handed out again


async def test_the_clock_starts_when_stream_is_called(vllm_engine: VllmEngine) -> None:
    ids = vllm_engine.synthetic_prompt(8, seed=903)
    request = GenerationRequest(
        "clock-at-call", prompt_token_ids=ids, sampling=SamplingSettings(max_tokens=2)
    )
    stream = vllm_engine.stream(request)
    called = time.perf_counter()
    await asyncio.sleep(0.05)  # the caller reads it later: that wait is kvscope's queue
    events = [event async for event in stream]
    accepted = events[0]
    assert isinstance(accepted, RequestAccepted)
    assert accepted.submitted_at <= called
    done = events[-1]
    assert isinstance(done, RequestFinished)
    assert done.ttft_s is not None
    assert done.ttft_s >= 0.05
