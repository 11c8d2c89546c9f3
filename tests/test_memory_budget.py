"""Where the engine's memory went, by vLLM's own accounting, and the bar that shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.memory_budget import GIB, MemoryBudget
from tui.widgets.model_card import memory_bar

if TYPE_CHECKING:
    from engine.vllm.engine import VllmEngine


def test_the_session_engine_accounts_its_weights_and_its_pool(vllm_engine: VllmEngine) -> None:
    card = vllm_engine.card
    budget = vllm_engine.features.memory
    assert card is not None and budget is not None
    # SmolLM2-135M in bf16: 135 M parameters x 2 bytes (tied embeddings counted once).
    assert 200e6 < budget.weights_bytes < 350e6, budget
    # The pool is the --kv-cache-memory-bytes the fixture asked for, to within a block.
    block_bytes = card.block_size * card.kv_bytes_per_token
    assert abs(budget.kv_pool_bytes - 128 * 1024**2) <= block_bytes, budget
    assert budget.kv_pool_tokens == card.kv_pool_tokens
    assert budget.device == "this machine's RAM" and budget.requested_bytes is None


def test_a_gpu_budget_names_every_part_and_the_bar_adds_up() -> None:
    b = MemoryBudget(
        device="GPU 0",
        total_bytes=24 * GIB,
        requested_bytes=int(21.6 * GIB),
        weights_bytes=int(15.2 * GIB),
        activations_bytes=int(1.4 * GIB),
        kv_pool_bytes=int(4.4 * GIB),
        kv_pool_tokens=80_384,
    )
    assert b.words() == (
        "weights 15.2 · activations 1.40 · KV pool 4.40 (80,384 tok) · other 0.60 · "
        "free 2.40 of 24.0 GiB (GPU 0)"
    )
    bar = memory_bar(b, 24)
    assert len(bar) == 24 and bar.startswith("W" * 15) and "A" in bar and "o" in bar
    assert bar.count("K") == 4 and bar.endswith("··")
