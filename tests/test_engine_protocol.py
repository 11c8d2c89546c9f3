"""The Engine protocol, checked the same way on the FakeEngine and the real vLLM engine.

The fake runs everywhere in milliseconds; the real one is the session's shared CPU engine.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from engine.errors import PromptTooLong
from engine.events import (
    ChatMessage,
    GenerationRequest,
    RequestAccepted,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)
from engine.fake import FakeConfig, FakeEngine
from engine.protocol import Engine


@pytest.fixture(params=["fake", "vllm"])
def engine(request: pytest.FixtureRequest) -> Engine:
    if request.param == "fake":
        fake = FakeEngine(FakeConfig(max_model_len=4096, block_size=16, total_blocks=512))
        fake.start()
        return fake
    engine: Engine = request.getfixturevalue("vllm_engine")
    return engine


_counter = 0


def _rid(tag: str) -> str:
    global _counter
    _counter += 1
    return f"{tag}-{_counter}"


async def _collect(engine: Engine, request: GenerationRequest) -> list[object]:
    return [e async for e in engine.stream(request)]


def test_satisfies_protocol(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    card = engine.card
    assert card is not None
    assert card.total_blocks > 0
    assert card.block_size > 0
    assert card.kv_bytes_per_token == 2 * card.num_layers * card.num_kv_heads * card.head_dim * 2


def test_synthetic_prompt_is_exact(engine: Engine) -> None:
    for n in (1, 5, 64, 300, 1000):
        assert len(engine.synthetic_prompt(n)) == n
    with_text = engine.synthetic_prompt(200, suffix="What is a KV cache?")
    assert len(with_text) == 200
    assert engine.synthetic_prompt(100, seed=1) != engine.synthetic_prompt(100, seed=2)


async def test_tokens_stream_with_one_itl_per_token_after_the_first(engine: Engine) -> None:
    request = GenerationRequest(
        _rid("stream"),
        prompt_token_ids=engine.synthetic_prompt(64),
        sampling=SamplingSettings(max_tokens=12, ignore_eos=True),
    )
    events = await _collect(engine, request)
    assert isinstance(events[0], RequestAccepted)
    assert events[0].prompt_tokens == 64
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    finished = events[-1]
    assert isinstance(finished, RequestFinished)
    assert finished.reason == "length"
    assert finished.output_tokens == 12 == sum(len(t.token_ids) for t in tokens)
    assert len(finished.itl_s) == finished.output_tokens - 1
    assert finished.ttft_s is not None
    assert finished.ttft_s > 0
    steps = [t.step for t in tokens]
    assert steps == sorted(steps)
    assert len(set(steps)) == len(steps)
    assert all(t.latency_s >= 0 for t in tokens)
    assert [t.index for t in tokens] == list(range(len(tokens)))


async def test_chat_messages_go_through_the_template(engine: Engine) -> None:
    messages = (ChatMessage("user", "Name one colour."),)
    ids = engine.chat_prompt_ids(messages)
    assert len(ids) > 3
    events = await _collect(
        engine,
        GenerationRequest(_rid("chat"), messages=messages, sampling=SamplingSettings(max_tokens=8)),
    )
    accepted = events[0]
    assert isinstance(accepted, RequestAccepted)
    assert accepted.prompt_tokens == len(ids)
    assert isinstance(events[-1], RequestFinished)


async def test_too_long_prompt_is_typed_and_the_engine_goes_on(engine: Engine) -> None:
    card = engine.card
    assert card is not None
    too_long = card.max_model_len + 1
    request = GenerationRequest(
        _rid("long"),
        prompt_token_ids=engine.synthetic_prompt(too_long),
        sampling=SamplingSettings(max_tokens=4),
    )
    with pytest.raises(PromptTooLong) as info:
        await _collect(engine, request)
    assert info.value.prompt_tokens == too_long
    assert info.value.max_model_len == card.max_model_len
    assert f"{too_long:,}" in info.value.plain()
    after = await _collect(
        engine,
        GenerationRequest(
            _rid("after"),
            prompt_token_ids=engine.synthetic_prompt(32),
            sampling=SamplingSettings(max_tokens=4, ignore_eos=True),
        ),
    )
    assert isinstance(after[-1], RequestFinished)
    assert after[-1].output_tokens == 4


async def test_abort_frees_the_requests_blocks(engine: Engine) -> None:
    card = engine.card
    assert card is not None
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    rid = _rid("abort")
    prompt = card.block_size * 2 + 5
    try:
        got: list[object] = []
        async for event in engine.stream(
            GenerationRequest(
                rid,
                prompt_token_ids=engine.synthetic_prompt(prompt),
                sampling=SamplingSettings(max_tokens=500, ignore_eos=True),
            )
        ):
            got.append(event)
            if isinstance(event, TokenEvent) and event.index >= 3:
                engine.abort(rid)
        finished = got[-1]
        assert isinstance(finished, RequestFinished)
        assert finished.reason == "abort"
        assert finished.output_tokens < 500
        held = [b for s in samples for b in s.blocks if b.request_id == rid]
        assert held
        assert len(held[-1].block_ids) == 3
        # A tiny request after the abort sees the whole pool free except its own block.
        samples.clear()
        await _collect(
            engine,
            GenerationRequest(
                _rid("probe"),
                prompt_token_ids=engine.synthetic_prompt(8),
                sampling=SamplingSettings(max_tokens=2, ignore_eos=True),
            ),
        )
        first = samples[0]
        assert all(b.request_id != rid for s in samples for b in s.blocks)
        assert first.free_blocks == first.total_blocks - 1
    finally:
        remove()


async def test_block_count_follows_the_tokens(engine: Engine) -> None:
    card = engine.card
    assert card is not None
    bs = card.block_size
    prompt = 2 * bs - 6  # crosses into a third block after a few decode steps
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    rid = _rid("blocks")
    try:
        await _collect(
            engine,
            GenerationRequest(
                rid,
                prompt_token_ids=engine.synthetic_prompt(prompt),
                sampling=SamplingSettings(max_tokens=12, ignore_eos=True),
            ),
        )
    finally:
        remove()
    mine = [b for s in samples for b in s.blocks if b.request_id == rid]
    assert mine, "no step reported the request's blocks"
    for held in mine:
        assert len(held.block_ids) == math.ceil(held.num_tokens / bs), held
        assert len(set(held.block_ids)) == len(held.block_ids)
    counts = [h.num_tokens for h in mine]
    assert counts[0] == prompt
    assert counts == list(range(prompt, prompt + len(counts)))
    assert {len(h.block_ids) for h in mine} == {2, 3}


async def test_concurrent_requests_hold_separate_blocks(engine: Engine) -> None:
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    ids = [_rid("pair"), _rid("pair")]
    try:
        await asyncio.gather(
            *(
                _collect(
                    engine,
                    GenerationRequest(
                        rid,
                        prompt_token_ids=engine.synthetic_prompt(100, seed=i),
                        sampling=SamplingSettings(max_tokens=6, ignore_eos=True),
                    ),
                )
                for i, rid in enumerate(ids)
            )
        )
    finally:
        remove()
    both = [s for s in samples if {b.request_id for b in s.blocks} >= set(ids)]
    assert both, "the two requests never ran in the same step"
    a, b = (next(x for x in both[0].blocks if x.request_id == rid) for rid in ids)
    assert not set(a.block_ids) & set(b.block_ids)
    assert both[0].running >= 2
