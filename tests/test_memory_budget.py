"""Where the engine's memory went, by vLLM's own accounting checked against the model's
config, and the bar that shows it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from session_engine import ENGINE_KV_BYTES

from engine.memory_budget import (
    GIB,
    LOADED_TENSORS,
    VLLM_ACCOUNTING,
    ConfigWeights,
    MemoryBudget,
    choose_weights,
    config_weights,
)
from engine.model_geometry import count_parameters
from engine.sizes import DTYPE_BYTES
from engine.vllm.internals import EngineIntrospector
from tui.widgets.model_card import memory_bar

if TYPE_CHECKING:
    from engine.vllm.engine import VllmEngine

# SmolLM2-135M's config.json, the sizes the parameter count reads.
SMOL = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
SMOL_BF16 = ConfigWeights(134_515_008, 2)
# What the CPU backend leaves as torch tensors on an AVX-512 machine with bf16: the
# embeddings, the norms and the rotary cos/sin cache (vLLM handed every linear weight to
# oneDNN). The figure issue 27 saw.
AVX512_LOADED_TENSORS = 57_742_432


def test_the_session_engine_accounts_its_weights_and_its_pool(vllm_engine: VllmEngine) -> None:
    card = vllm_engine.card
    budget = vllm_engine.features.memory
    assert card is not None and budget is not None
    config = json.loads((Path(card.path) / "config.json").read_text("utf-8"))
    expected = count_parameters(config) * DTYPE_BYTES[card.dtype.replace("torch.", "")]
    # Parameters x dtype bytes, to within 1%: the loaded tensors, where they hold every
    # weight, add vLLM's rotary cos/sin cache (max positions x head_dim x 2 B, 0.4% of
    # SmolLM2-135M); one decoder layer's weights are 2.6%, so a missed layer fails.
    assert abs(budget.weights_bytes - expected) <= 0.01 * expected, budget
    assert budget.source in (LOADED_TENSORS, VLLM_ACCOUNTING) or (
        budget.source.startswith("the model's config") and budget.weights_bytes == expected
    ), budget
    assert f"weights from {budget.source}" in budget.words()
    # The pool is the --kv-cache-memory-bytes the fixture asked for, to within a block.
    block_bytes = card.block_size * card.kv_bytes_per_token
    assert abs(budget.kv_pool_bytes - ENGINE_KV_BYTES) <= block_bytes, budget
    assert budget.kv_pool_tokens == card.kv_pool_tokens
    assert budget.device == "this machine's RAM" and budget.requested_bytes is None
    assert budget.other_bytes is None and not budget.pool_fixed


def test_the_config_figure_is_shown_where_the_measured_one_is_more_than_2x_off() -> None:
    config = config_weights(SMOL, 2)
    assert config == SMOL_BF16 and config.bytes == 269_030_016
    weights, source = choose_weights(AVX512_LOADED_TENSORS, LOADED_TENSORS, config)
    assert weights == 269_030_016
    assert source == (
        "the model's config (134,515,008 parameters x 2 B): "
        "the loaded tensors gave 55.1 MiB, more than 2x off"
    )
    # Too large is as wrong as too small; no figure at all takes the config's too.
    assert choose_weights(4 * config.bytes, VLLM_ACCOUNTING, config)[0] == config.bytes
    assert choose_weights(None, LOADED_TENSORS, config) == (
        config.bytes,
        "the model's config (134,515,008 parameters x 2 B): the loaded tensors gave none",
    )
    # Within 2x either way the measurement stands: it sees buffers the count does not.
    measured = config.bytes + 1_049_056
    assert choose_weights(measured, LOADED_TENSORS, config) == (measured, LOADED_TENSORS)
    assert choose_weights(config.bytes // 2, VLLM_ACCOUNTING, config)[0] == config.bytes // 2
    # A model the count does not describe (experts) keeps vLLM's figure.
    assert config_weights({**SMOL, "num_local_experts": 8}, 2) is None
    assert choose_weights(123, VLLM_ACCOUNTING, None) == (123, VLLM_ACCOUNTING)


def test_the_words_say_which_weights_figure_the_bar_shows() -> None:
    weights, source = choose_weights(AVX512_LOADED_TENSORS, LOADED_TENSORS, SMOL_BF16)
    b = MemoryBudget(
        device="this machine's RAM",
        total_bytes=None,
        requested_bytes=None,
        weights_bytes=weights,
        activations_bytes=None,
        kv_pool_bytes=128 * 1024**2,
        kv_pool_tokens=5_632,
        source=source,
    )
    assert b.words() == (
        "weights 0.25 · KV pool 0.12 (5,632 tok) GiB (this machine's RAM); weights from "
        "the model's config (134,515,008 parameters x 2 B): the loaded tensors gave "
        "55.1 MiB, more than 2x off"
    )
    # 269 MB of weights beside a 128 MiB pool: two thirds of the bar.
    assert memory_bar(b, 24) == "W" * 16 + "K" * 8


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
        "free 2.40 of 24.0 GiB (GPU 0); weights from vLLM's start-up accounting"
    )
    bar = memory_bar(b, 24)
    assert len(bar) == 24 and bar.startswith("W" * 15) and "A" in bar and "o" in bar
    assert bar.count("K") == 4 and bar.endswith("··")


def test_a_gpu_pool_fixed_by_kv_cache_memory_bytes_shows_no_other() -> None:
    # The embedded model on an L4 with the fixture's fixed pool: vLLM checked that 0.92 of
    # the GPU was free at start-up, then allocated only the weights and the pool; it set
    # no peak_activation_memory. The 20 GiB between them is not vLLM's "other".
    total = int(22.5 * GIB)
    b = MemoryBudget(
        device="GPU 0",
        total_bytes=total,
        requested_bytes=int(0.92 * total),
        weights_bytes=SMOL_BF16.bytes,
        activations_bytes=None,
        kv_pool_bytes=128 * 1024**2,
        kv_pool_tokens=5_632,
        pool_fixed=True,
    )
    assert b.other_bytes is None
    assert [name for name, _ in b.parts()] == ["weights", "KV pool", "not counted"]
    assert b.free_bytes == total - SMOL_BF16.bytes - 128 * 1024**2
    assert b.words() == (
        "weights 0.25 · KV pool 0.12 (5,632 tok) · not counted 22.1 of 22.5 GiB (GPU 0; "
        "pool fixed by --kv-cache-memory-bytes, so vLLM measured no activations); "
        "weights from vLLM's start-up accounting"
    )
    bar = memory_bar(b, 24)
    assert len(bar) == 24 and "o" not in bar and bar.startswith("WK")


def _introspector(worker: SimpleNamespace, kv_cache_memory_bytes: int | None) -> EngineIntrospector:
    """The parts of vLLM's engine `EngineIntrospector.memory_budget` reads, as plain
    objects: one in-process worker, SmolLM2-135M's config, a 128 MiB pool of 5,632 tokens."""
    view = SimpleNamespace(
        core=SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker))
        ),
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(
                quantization=None,
                hf_text_config=SimpleNamespace(**SMOL),
                dtype=SimpleNamespace(itemsize=2),
            ),
            parallel_config=SimpleNamespace(world_size=1),
            cache_config=SimpleNamespace(kv_cache_memory_bytes=kv_cache_memory_bytes),
        ),
        scheduler=SimpleNamespace(
            kv_cache_config=SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=128 * 1024**2)])
        ),
        kv_capacity_tokens=0,
        total_blocks=352,
        block_size=16,
    )
    return cast("EngineIntrospector", view)


def _tensor(numel: int, element_size: int = 2) -> SimpleNamespace:
    return SimpleNamespace(numel=lambda: numel, element_size=lambda: element_size)


def test_the_introspector_checks_the_cpu_backends_loaded_tensors() -> None:
    # The CPU runner keeps no model_memory_usage; on AVX-512 with bf16 only the embeddings
    # and norms stay parameters, and the rotary cache is a buffer.
    model = SimpleNamespace(
        parameters=lambda: [_tensor(49152 * 576), _tensor(61 * 576), _tensor(0)],
        buffers=lambda: [_tensor(8192 * 64)],
    )
    runner = SimpleNamespace(get_model=lambda: model)
    worker = SimpleNamespace(model_runner=runner)
    budget = EngineIntrospector.memory_budget(_introspector(worker, 128 * 1024**2))
    assert budget is not None
    assert budget.weights_bytes == SMOL_BF16.bytes
    assert budget.source.startswith("the model's config (134,515,008 parameters x 2 B)")
    assert "the loaded tensors gave 55.1 MiB" in budget.source
    assert budget.device == "this machine's RAM" and not budget.pool_fixed
    assert budget.other_bytes is None and budget.kv_pool_tokens == 352 * 16


def _gpu_worker(**profiled: Any) -> SimpleNamespace:
    total = int(22.5 * GIB)  # an L4
    return SimpleNamespace(
        model_runner=SimpleNamespace(model_memory_usage=SMOL_BF16.bytes + 3 * 1024**2),
        init_snapshot=SimpleNamespace(total_memory=total),
        requested_memory=int(0.92 * total),
        local_rank=0,
        **profiled,
    )


def test_the_introspector_shows_no_other_for_a_gpu_pool_of_fixed_size() -> None:
    # vLLM's GPU worker with --kv-cache-memory-bytes: no peak_activation_memory attribute.
    budget = EngineIntrospector.memory_budget(_introspector(_gpu_worker(), 128 * 1024**2))
    assert budget is not None and budget.pool_fixed
    assert budget.weights_bytes == SMOL_BF16.bytes + 3 * 1024**2
    assert budget.source == VLLM_ACCOUNTING
    assert budget.other_bytes is None and budget.activations_bytes is None
    assert "other" not in budget.words() and "o" not in memory_bar(budget, 24)
    # The same GPU sized by its share: vLLM profiled, and its share is all held.
    profiled = _gpu_worker(peak_activation_memory=GIB // 4)
    shared = EngineIntrospector.memory_budget(_introspector(profiled, None))
    assert shared is not None and not shared.pool_fixed
    assert shared.other_bytes is not None and shared.other_bytes > 19 * GIB
