"""The block map's incremental read of vLLM's block lists equals a full read, every step."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.events import GenerationRequest, SamplingSettings, StepSample


async def test_incremental_block_ids_equal_vllms_own_every_step(vllm_engine: Any) -> None:
    engine = vllm_engine
    mismatches: list[str] = []
    checked = [0]

    def compare(sample: StepSample) -> None:
        # Listeners run on the step thread, between steps: vLLM's state is stable here.
        intro = engine.introspection
        for rb in sample.blocks:
            live = engine._book.get(rb.request_id)
            if live is None:
                continue
            groups = intro.kv_manager.get_block_ids(live.internal_id)
            drawn = groups[intro.drawn] if groups else ()
            full = tuple(b - 1 for b in drawn if b > 0)
            checked[0] += 1
            if full != rb.block_ids:
                mismatches.append(f"step {sample.step} {rb.request_id}: {rb.block_ids} != {full}")

    async def one(i: int) -> None:
        ids = engine.synthetic_prompt(200 + 150 * i, seed=700 + i)
        request = GenerationRequest(
            f"blocks-{i}", prompt_token_ids=ids, sampling=SamplingSettings(40, ignore_eos=True)
        )
        async for _ in engine.stream(request):
            pass

    remove = engine.add_step_listener(compare)
    try:
        await asyncio.gather(*(one(i) for i in range(3)))
    finally:
        remove()
    assert checked[0] > 50
    assert not mismatches, mismatches[:3]
