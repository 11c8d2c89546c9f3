"""The one rule that tells a request waiting for KV blocks from one waiting on the
scheduler's token budget, as `StepSample` decides it."""

from __future__ import annotations

import pytest

from engine.events import StepSample


def _sample(free_blocks: int, block_size: int = 16) -> StepSample:
    return StepSample(
        step=1,
        started_at=0.0,
        duration_s=0.1,
        prefill_tokens=0,
        decode_tokens=0,
        running=1,
        waiting=1,
        kv_usage=0.5,
        free_blocks=free_blocks,
        total_blocks=100,
        block_size=block_size,
    )


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [(0, 0), (1, 1), (16, 1), (17, 2), (32, 2), (33, 3), (2**60 + 1, 2**56 + 1)],
)
def test_a_prompt_fills_its_blocks_rounded_up(tokens: int, blocks: int) -> None:
    assert _sample(free_blocks=0).blocks_for(tokens) == blocks


def test_a_sample_that_knows_no_block_size_counts_one_token_a_block() -> None:
    assert _sample(free_blocks=0, block_size=0).blocks_for(5) == 5


@pytest.mark.parametrize(("free", "short"), [(1, True), (2, False), (3, False)])
def test_a_request_is_short_of_kv_only_when_fewer_blocks_are_free_than_it_fills(
    free: int, short: bool
) -> None:
    # 17 tokens fill two 16-token blocks.
    assert _sample(free_blocks=free).short_of_kv(17) is short
