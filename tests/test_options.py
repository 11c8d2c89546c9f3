"""kvscope's engine options: the no-flags fast path agrees with vLLM's own parser, and the
embedded model's defaults on a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from engine.nvml import GpuDevice
from engine.vllm import options
from engine.vllm.options import build_engine_settings


def test_no_flags_gives_the_same_engine_args_as_the_parser() -> None:
    fast = build_engine_settings([]).engine_args
    # Any flag at its default value takes the parser path.
    parsed = build_engine_settings(["--seed", str(fast.seed)]).engine_args
    differ = {
        f.name: (getattr(fast, f.name), getattr(parsed, f.name))
        for f in dataclasses.fields(fast)
        if getattr(fast, f.name) != getattr(parsed, f.name)
    }
    assert not differ


# -- the embedded model's defaults on a GPU (no GPU needed: gpu_present is asked) -----------

H200 = GpuDevice(0, "NVIDIA H200", 140 * 1024**3, 140 * 1024**3)
MIB = 1024**2


@pytest.fixture
def on_an_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "gpu_present", lambda: True)
    monkeypatch.setattr(options, "gpu_devices", lambda: [H200])


@pytest.mark.parametrize(
    ("argv", "kv_bytes", "utilization"),
    [
        # kvscope's own: the CPU's 256 MiB pool, a start-up check of 4 GiB + the pool.
        ([], 256 * MIB, 0.04),
        (["--max-model-len", "4096"], 256 * MIB, 0.04),
        # The user's pool: kept, and the check sized to it (4 GiB + 20 GiB of 140).
        (["--kv-cache-memory-bytes", str(20 * 1024**3)], 20 * 1024**3, 0.18),
        # A profiled pool is sized from the fraction: vLLM's defaults.
        (["--num-gpu-blocks-override", "100"], None, 0.92),
        (["--gpu-memory-utilization", "0.5"], None, 0.5),
        (["--kv-cache-memory-bytes", str(MIB), "--gpu-memory-utilization", "0.3"], MIB, 0.3),
    ],
)
def test_the_embedded_model_on_a_gpu_gets_a_small_fixed_pool(
    on_an_h200: None, argv: list[str], kv_bytes: int | None, utilization: float
) -> None:
    settings = build_engine_settings(argv, prepare=False)
    assert settings.on_gpu and settings.embedded
    args = settings.engine_args
    assert (args.kv_cache_memory_bytes, args.gpu_memory_utilization) == (kv_bytes, utilization)
    assert args.enforce_eager is False  # vLLM's own: CUDA graphs, as `vllm serve` runs


def test_a_users_model_on_a_gpu_keeps_vllms_defaults(on_an_h200: None) -> None:
    args = build_engine_settings(["--model", "Qwen/Qwen2.5-7B-Instruct"]).engine_args
    assert (args.kv_cache_memory_bytes, args.gpu_memory_utilization) == (None, 0.92)
    assert args.enforce_eager is False


def test_the_check_fits_the_device() -> None:
    l4 = 23_034 * MIB  # nvidia-smi's memory.total for an L4
    assert options.embedded_gpu_utilization(l4, 256 * MIB) == 0.19
    assert options.embedded_gpu_utilization(140 * 1024**3, 256 * MIB) == 0.04
    assert options.embedded_gpu_utilization(4 * 1024**3, 256 * MIB) == 0.92  # never more
