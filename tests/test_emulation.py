"""GPU emulation sizes the real engine's pool to the roofline's token count."""

from __future__ import annotations

import pytest
from subprocess_report import run_and_report

from engine.errors import BadOption
from roofline.emulation import plan_emulation
from roofline.floors import emulated_pool_tokens
from roofline.hardware import load_geometry, load_profile


def test_plan_asks_for_the_predicted_pool() -> None:
    plan = plan_emulation("l4", "qwen2.5-7b-instruct", [], memory_bytes=24 * 2**30)
    predicted = emulated_pool_tokens(load_geometry("qwen2.5-7b-instruct"), load_profile("l4"))
    assert 70_000 < predicted < 90_000
    assert predicted - 128 < plan.info.pool_tokens <= predicted
    # One extra block for vLLM's null block, at SmolLM2's 23,040 bytes per token.
    assert plan.kv_cache_memory_bytes == (plan.pool_blocks + 1) * 128 * 23040
    assert plan.engine_argv[-2:] == ["--kv-cache-memory-bytes", str(plan.kv_cache_memory_bytes)]
    assert "57,344" in plan.info.detail
    assert "23,040" in plan.info.detail
    assert plan.info.label == "emulating L4 / Qwen2.5-7B-Instruct"


def test_too_big_a_pool_offers_the_largest_scale_that_fits() -> None:
    with pytest.raises(BadOption) as info:
        plan_emulation("h200", "llama-3.1-8b", [], memory_bytes=24 * 2**30)
    text = info.value.plain()
    assert "--emulate-scale" in text
    scale = float(text.rsplit("--emulate-scale ", 1)[1].split()[0])
    assert 0 < scale < 1
    plan = plan_emulation("h200", "llama-3.1-8b", [], scale=scale, memory_bytes=24 * 2**30)
    assert plan.info.scale == scale
    assert plan.kv_cache_memory_bytes <= 24 * 2**30 * 0.4


def test_conflicting_pool_flag_is_refused() -> None:
    with pytest.raises(BadOption):
        plan_emulation("l4", "qwen2.5-7b-instruct", ["--kv-cache-memory-bytes", "1000"])


@pytest.mark.engine
def test_real_engine_pool_matches_the_emulated_gpu_within_one_block() -> None:
    script = (
        "import json\n"
        "from roofline.emulation import plan_emulation\n"
        "from engine.vllm.engine import VllmEngine\n"
        "from engine.vllm.options import gpu_present\n"
        "plan = plan_emulation('l4', 'qwen2.5-7b-instruct', ['--max-model-len', '2048'],\n"
        "                      on_gpu=gpu_present())\n"
        "e = VllmEngine(argv=plan.engine_argv, emulation=plan.info)\n"
        "card = e.start()\n"
        "print('CARD' + json.dumps({'pool': card.kv_pool_tokens, 'bs': card.block_size,"
        " 'want': plan.info.pool_tokens, 'label': card.emulation.label}))\n"
        "e.shutdown()\n"
    )
    card = run_and_report(script, "CARD")
    assert abs(card["pool"] - card["want"]) <= card["bs"], card
    assert card["label"].startswith("emulating L4")
