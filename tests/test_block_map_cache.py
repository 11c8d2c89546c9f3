"""The block map's prefix-cache states: cached (free, evictable) and reused (a prefix hit).

The states come from the engine (BlockCacheState on every sample): the tracker that both
in-process engines keep, the FakeEngine's model of vLLM's prefix cache, the widget that
draws them, and (marked `engine`) the real vLLM pool on a second turn with the same prefix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING

from textual.app import App
from tui_helpers import block_sample

from engine.block_cache import BlockCacheTracker
from engine.clock import VirtualClock
from engine.events import (
    PAGE_BLOCKS,
    BlockCacheState,
    ChatMessage,
    GenerationRequest,
    RequestBlocks,
    RequestFinished,
    SamplingSettings,
    StepSample,
)
from engine.fake import FakeConfig, FakeEngine
from engine.tape.format import Decoder, Encoder
from tui.widgets.kv_block_map import CACHED, FREE, REUSED, USED, KvBlockMap, cells_of

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from engine.protocol import Engine


# -- the tracker ---------------------------------------------------------------------------


def test_tracker_states_follow_each_change_and_share_unchanged_pages() -> None:
    t = BlockCacheTracker(3 * PAGE_BLOCKS)
    t.taken((1, 2, 3), reused=False)
    t.freed((2, 1), (3,))  # block 3 was not full: no prefix kept
    first = t.state()
    assert first.cached_ids() == (1, 2) and first.cached == 2 and first.reused == 0
    assert t.state() is first  # nothing changed: the same value, no rebuild
    t.taken((1,), reused=True)  # a prefix hit takes block 1 back
    t.taken((2,), reused=False)  # a fresh block evicts block 2's prefix
    t.taken((PAGE_BLOCKS * 2 + 5,), reused=True)
    second = t.state()
    assert second.cached_ids() == () and second.reused_ids() == (1, PAGE_BLOCKS * 2 + 5)
    assert (second.cached, second.reused) == (0, 2)
    assert second.reused_pages[1] is first.reused_pages[1]  # untouched page: same tuple
    t.freed((1,))
    assert t.state().reused == 1 and t.state().cached_ids() == (1,)
    t.evicted((1,))
    assert t.state().cached == 0
    t.freed((7, 3 * PAGE_BLOCKS))  # an ID past the pool is no block of it
    assert t.state().cached_ids() == (7,)
    t.clear()
    assert t.state().cached_ids() == ()


# -- the widget ----------------------------------------------------------------------------


class MapApp(App[None]):
    def compose(self) -> ComposeResult:
        yield KvBlockMap()


def _cache(
    total: int, cached: tuple[int, ...] = (), reused: tuple[int, ...] = ()
) -> BlockCacheState:
    t = BlockCacheTracker(total)
    t.freed(cached)
    t.taken(reused, reused=True)
    return t.state()


def _with_cache(sample: StepSample, state: BlockCacheState | None) -> StepSample:
    return dataclasses.replace(sample, block_cache=state)


async def test_map_draws_cached_blocks_apart_from_empty_and_reused_apart_from_held() -> None:
    app = MapApp()
    async with app.run_test(size=(40, 10)):
        block_map = app.query_one(KvBlockMap)
        # The first turn finished: its four full blocks stay cached, block 4 is empty.
        block_map.show_sample(_with_cache(block_sample((), total=16), _cache(16, (0, 1, 2, 3))))
        glyphs = "".join(c.glyph for c in block_map.cells(16))
        assert glyphs == CACHED * 4 + FREE * 12
        text = block_map.as_text(40).plain
        assert "cached 4 (evictable)" in text and "free 16/16" in text
        # The second turn lands on the first two and takes two fresh blocks after them.
        turn2 = (RequestBlocks("r2", (0, 1, 4, 5), 64),)
        block_map.show_sample(
            _with_cache(block_sample(turn2, total=16), _cache(16, (2, 3), reused=(0, 1)))
        )
        glyphs = "".join(c.glyph for c in block_map.cells(16))
        assert glyphs == REUSED * 2 + CACHED * 2 + USED * 2 + FREE * 10
        text = block_map.as_text(40).plain
        assert "reused 2 (from cache)" in text and "cached 2 (evictable)" in text
        # The step-by-step update draws what a rebuild from scratch draws.
        assert block_map.cells(16) == cells_of(
            block_map._owners, 1, block_map._cached, block_map._reused
        )
        # The cache reset (or evicted) while the blocks were free: empty, not cached.
        block_map.show_sample(_with_cache(block_sample((), total=16), _cache(16)))
        assert "".join(c.glyph for c in block_map.cells(16)) == FREE * 16
        block_map.show_sample(
            _with_cache(block_sample(turn2, total=16), _cache(16, (2, 3), (0, 1)))
        )
        # An engine that stops saying (no prefix caching): plain free and held again.
        block_map.show_sample(block_sample(turn2, total=16))
        glyphs = "".join(c.glyph for c in block_map.cells(16))
        assert glyphs == USED * 2 + FREE * 2 + USED * 2 + FREE * 10
        assert "cached" not in block_map.as_text(40).plain


async def test_a_cell_of_several_blocks_shows_cached_when_none_is_held() -> None:
    app = MapApp()
    async with app.run_test(size=(20, 10)):
        block_map = app.query_one(KvBlockMap)
        block_map.max_rows = 1
        sample = block_sample((RequestBlocks("r1", (0, 1, 2, 3), 64),), total=40)
        block_map.show_sample(_with_cache(sample, _cache(40, (4, 5), reused=(0, 1, 2))))
        cells = block_map.cells(20)  # 2 blocks a character
        assert [c.glyph for c in cells[:4]] == [REUSED, USED, CACHED, FREE]


# -- the FakeEngine's prefix cache ---------------------------------------------------------


async def _turn(engine: Engine, rid: str, messages: tuple[ChatMessage, ...]) -> RequestFinished:
    done = None
    request = GenerationRequest(rid, messages=messages, sampling=SamplingSettings(max_tokens=20))
    async for event in engine.stream(request):
        if isinstance(event, RequestFinished):
            done = event
    assert done is not None
    return done


QUESTION = ChatMessage("user", " ".join(f"word{i}" for i in range(40)))


async def test_fake_second_turn_lands_on_the_blocks_the_first_left() -> None:
    engine = FakeEngine(FakeConfig(prefix_caching=True), clock=VirtualClock())
    engine.start()
    samples: list[StepSample] = []
    engine.add_step_listener(samples.append)
    first = await _turn(engine, "r1", (QUESTION,))
    assert first.cached_prompt_tokens == 0
    r1 = [b for s in samples for b in s.blocks if b.request_id == "r1"][-1].block_ids
    idle = samples[-1]
    assert idle.idle and idle.block_cache is not None
    # 47 prompt + 20 output tokens: four full blocks kept, the fifth (partial) emptied.
    assert idle.block_cache.cached_ids() == r1[:4]
    reply = ChatMessage("assistant", "The KV cache keeps the keys")
    second = await _turn(engine, "r2", (QUESTION, reply, ChatMessage("user", "and then")))
    # Both prompts open with the same 44 tokens: two full 16-token blocks are hits.
    assert second.cached_prompt_tokens == 32
    landed = next(s for s in samples if any(b.request_id == "r2" for b in s.blocks))
    assert landed.prefill_tokens == second.prompt_tokens - 32
    r2 = next(b for b in landed.blocks if b.request_id == "r2").block_ids
    assert r2[:2] == r1[:2]
    assert landed.block_cache is not None
    assert landed.block_cache.reused_ids() == r1[:2]
    assert landed.block_cache.cached_ids() == r1[2:4]


async def test_fake_without_prefix_caching_says_nothing_of_a_cache() -> None:
    engine = FakeEngine(clock=VirtualClock())
    engine.start()
    samples: list[StepSample] = []
    engine.add_step_listener(samples.append)
    done = await _turn(engine, "r1", (QUESTION,))
    await _turn(engine, "r2", (QUESTION, ChatMessage("user", "again")))
    assert done.cached_prompt_tokens is None
    assert all(s.block_cache is None for s in samples)


async def test_fake_evicts_the_oldest_cached_block_only_when_no_empty_one_is_left() -> None:
    engine = FakeEngine(FakeConfig(prefix_caching=True, total_blocks=6), clock=VirtualClock())
    engine.start()
    samples: list[StepSample] = []
    engine.add_step_listener(samples.append)
    await _turn(engine, "r1", (QUESTION,))  # leaves 4 cached, 2 empty
    other = ChatMessage("user", " ".join(f"other{i}" for i in range(20)))
    await _turn(engine, "r2", (other,))  # 27 + 20 tokens: 3 blocks, one of them evicted
    state = samples[-1].block_cache
    assert state is not None
    assert samples[-1].free_blocks == 6
    # r1's tail block went first (vLLM frees a request tail first); r2's two full blocks
    # are cached now, and its partial one is empty.
    assert state.cached == 5


def test_block_cache_state_survives_a_tape() -> None:
    sample = _with_cache(
        block_sample((RequestBlocks("r2", (0, 1), 32),), total=16), _cache(16, (2, 3), (0, 1))
    )
    encoder, decoder = Encoder(), Decoder()
    line = json.dumps(encoder.encode("step", sample, 0.0))  # as the tape writer writes it
    back, _ = decoder.decode(json.loads(line))
    assert isinstance(back, StepSample)
    assert back.block_cache == sample.block_cache


# -- the real engine -----------------------------------------------------------------------


async def test_real_second_turn_reuses_the_first_turns_blocks(vllm_engine: Engine) -> None:
    """vLLM's own pool: a second prompt with the first one's prefix is given the first
    one's full blocks back (reused), and until then they are cached, not empty."""
    engine = vllm_engine
    card = engine.card
    assert card is not None
    size = card.block_size  # 128 on the CPU backend
    prefix = engine.synthetic_prompt(2 * size + 40, seed=7301)
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    try:
        first = await _ids_turn(engine, "cache-r1", prefix)
        r1 = [b for s in samples for b in s.blocks if b.request_id == "cache-r1"][-1].block_ids
        after_first = samples[-1].block_cache
        samples.clear()
        second = await _ids_turn(
            engine, "cache-r2", prefix + engine.synthetic_prompt(20, seed=7302)
        )
    finally:
        remove()
    assert first.cached_prompt_tokens == 0
    assert second.cached_prompt_tokens == 2 * size
    assert after_first is not None
    assert set(r1[:2]) <= set(after_first.cached_ids())  # freed, still holding the prefix
    landed = next(s for s in samples if any(b.request_id == "cache-r2" for b in s.blocks))
    r2 = next(b for b in landed.blocks if b.request_id == "cache-r2").block_ids
    assert r2[:2] == r1[:2]
    assert landed.block_cache is not None
    assert set(r1[:2]) <= set(landed.block_cache.reused_ids())
    assert not set(r2) & set(landed.block_cache.cached_ids())


async def _ids_turn(engine: Engine, rid: str, ids: tuple[int, ...]) -> RequestFinished:
    done = None
    request = GenerationRequest(
        rid, prompt_token_ids=ids, sampling=SamplingSettings(4, ignore_eos=True)
    )
    async for event in engine.stream(request):
        if isinstance(event, RequestFinished):
            done = event
    assert done is not None
    await asyncio.sleep(0)
    return done
