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


def test_on_a_gpu_the_emulated_pool_is_sized_from_the_gpus_memory_and_block_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An L4 pool for a 7B model on a 24 GiB GPU: CUDA's 16-token blocks, and the budget
    from the device's 24 GiB, not the host's RAM (which may be 2 TB or 16 GB)."""
    import argparse
    import sys
    import types
    from types import SimpleNamespace

    from cli.engine_choice import _in_process

    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA L4"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(  # type: ignore[attr-defined]
        total=24 * 2**30, free=23 * 2**30, used=2**30
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # A host with little RAM: sized from it, the pool would not fit.
    monkeypatch.setattr("roofline.emulation.total_memory_bytes", lambda: 2 * 2**30)
    args = argparse.Namespace(
        emulate_gpu="l4", emulate_model="qwen2.5-7b-instruct", emulate_scale=1.0
    )
    from engine.vllm.engine import VllmEngine

    engine = _in_process(args, [])  # sized from 2 GiB of host RAM this would refuse
    assert isinstance(engine, VllmEngine)
    assert engine.emulation is not None and engine.argv is not None
    pool = int(engine.argv[engine.argv.index("--kv-cache-memory-bytes") + 1])
    blocks = engine.emulation.pool_tokens // 16
    assert engine.emulation.pool_tokens % 16 == 0
    assert pool == (blocks + 1) * 16 * 23040  # CUDA's 16-token blocks of SmolLM2's KV
