"""A step announced as it begins: the long prefill that used to read as "idle"."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from engine_hooks import SCHEDULING_MODES, scheduling

from engine.events import GenerationRequest, SamplingSettings, StepSample, StepStarted
from engine.vllm.internals import EngineIntrospector, ScheduledWork

if TYPE_CHECKING:
    from engine.vllm.engine import VllmEngine


@pytest.mark.parametrize("mode", SCHEDULING_MODES)
async def test_each_step_is_announced_before_its_sample(vllm_engine: VllmEngine, mode: str) -> None:
    """One announcement per step that runs work, numbered as its sample will be; in lockstep
    right before it, with batches in flight one batch ahead of it (the previous batch's
    sample comes between)."""
    with scheduling(vllm_engine, mode):
        await _one_request_seen(vllm_engine, mode)


async def _one_request_seen(vllm_engine: VllmEngine, mode: str) -> None:
    starts = vllm_engine.features.step_starts
    assert starts is not None
    seen: list[StepStarted | StepSample] = []
    remove_start = starts.add_step_start_listener(seen.append)
    remove_step = vllm_engine.add_step_listener(seen.append)
    try:
        rid = f"step-start-{mode}"
        prompt = vllm_engine.synthetic_prompt(48, seed=4242)
        async for _ in vllm_engine.stream(
            GenerationRequest(
                rid,
                prompt_token_ids=prompt,
                sampling=SamplingSettings(max_tokens=3, ignore_eos=True),
            )
        ):
            pass
        await asyncio.sleep(0)
    finally:
        remove_start()
        remove_step()
    ran = [s for s in seen if isinstance(s, StepSample) and not s.idle]
    begun = [s for s in seen if isinstance(s, StepStarted)]
    assert len(begun) == len(ran) >= 3
    assert [s.step for s in begun] == [s.step for s in ran]
    ahead = 0 if mode == "lockstep" else 1
    for start, sample in zip(begun, ran, strict=True):
        # Each start comes before the sample of the same step, and says the same work.
        assert seen.index(start) < seen.index(sample)
        between = seen[seen.index(start) + 1 : seen.index(sample)]
        assert len([s for s in between if isinstance(s, StepSample)]) <= ahead, between
        assert (start.prefill_tokens, start.decode_tokens) == (
            sample.prefill_tokens,
            sample.decode_tokens,
        )
        assert start.started_at <= sample.started_at + sample.duration_s
    first = begun[0]
    assert first.prefill_tokens == len(prompt)
    (chunk,) = first.chunks
    assert (chunk.request_id, chunk.tokens, chunk.chunk, chunk.chunks) == (rid, len(prompt), 1, 1)
    # The blocks it was given are there before the model runs: enough for the whole prompt.
    (held,) = first.blocks
    assert held.request_id == rid
    block_size = vllm_engine.card.block_size if vllm_engine.card else 16
    assert len(held.block_ids) * block_size >= len(prompt)
    assert first.total_blocks - first.free_blocks >= len(held.block_ids)
    assert begun[1].decoding == 1 and not begun[1].chunks


def _introspector(budget: int, requests: dict[str, SimpleNamespace]) -> EngineIntrospector:
    # The reader without an engine: only what `started` reads.
    intro = EngineIntrospector.__new__(EngineIntrospector)
    intro.vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=budget)
    )
    intro.scheduler = SimpleNamespace(requests=requests)
    intro.kv_manager = SimpleNamespace(get_block_ids=lambda rid: ([1, 2, 3],))
    intro.block_pool = SimpleNamespace(num_gpu_blocks=11, get_num_free_blocks=lambda: 7)
    intro.cache_tracker = None  # prefix caching's block states: not what this reads
    intro._begin(intro.kv_manager, ())
    return intro


def test_a_chunked_prefill_counts_its_chunks() -> None:
    # A 5,000-token prompt at a 2,048-token budget: chunks 1, 2 and 3 of 3.
    request = SimpleNamespace(num_computed_tokens=0, num_tokens=5000)
    intro = _introspector(2048, {"i": request})
    seen = []
    for done, size in ((0, 2048), (2048, 2048), (4096, 904)):
        request.num_computed_tokens = done + size  # vLLM counts them at schedule time
        work = ScheduledWork(size, 0, (), {"i": (size, 0)})
        seen.append(intro.started(work, {"i": "r7"}, step=1))
    assert [(c.chunk, c.chunks) for s in seen for c in s.chunks] == [(1, 3), (2, 3), (3, 3)]
    assert seen[0].chunks[0].request_id == "r7"
    assert seen[0].blocks[0].block_ids == (0, 1, 2)  # vLLM's IDs minus the null block
    assert (seen[0].free_blocks, seen[0].total_blocks) == (7, 10)
    # Preempted and prefilled again from the start: chunk 1 once more.
    request.num_computed_tokens = 2048
    again = intro.started(ScheduledWork(2048, 0, (), {"i": (2048, 0)}), {"i": "r7"}, step=9)
    assert (again.chunks[0].chunk, again.chunks[0].chunks) == (1, 3)


async def test_a_prompt_that_repeats_a_cached_prefix_says_how_much_was_cached(
    vllm_engine: VllmEngine,
) -> None:
    from engine.events import RequestFinished

    card = vllm_engine.card
    assert card is not None
    # Two whole blocks of shared prefix, then a different tail: vLLM caches whole blocks.
    prefix = vllm_engine.synthetic_prompt(2 * card.block_size + 8, seed=777)
    finished: list[RequestFinished] = []
    for i, tail in enumerate(((11, 12, 13), (21, 22, 23))):
        async for event in vllm_engine.stream(
            GenerationRequest(
                f"cached-{i}",
                prompt_token_ids=prefix + tail,
                sampling=SamplingSettings(max_tokens=1, ignore_eos=True),
            )
        ):
            if isinstance(event, RequestFinished):
                finished.append(event)
    first, second = finished
    assert not first.cached_prompt_tokens
    assert second.cached_prompt_tokens is not None
    assert 2 * card.block_size <= second.cached_prompt_tokens < second.prompt_tokens
