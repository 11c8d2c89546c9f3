"""GPU emulation: size this engine's KV pool, in tokens, as a given model gets on a GPU.

The local model still computes (on whatever this machine has), but the pool holds the
same number of tokens as, say, Qwen2.5-7B on an L4 at gpu_memory_utilization 0.9, so the
prompt-length slider and the concurrency control hit the pool wall at the same token
counts as on that GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import BadOption
from engine.events import EmulationInfo
from roofline.cpu_calibration import total_memory_bytes
from roofline.floors import emulated_pool_tokens
from roofline.hardware import load_geometry, load_profile

if TYPE_CHECKING:
    from collections.abc import Sequence

    from roofline.geometry import ModelGeometry

CPU_BLOCK_SIZE = 128
GPU_BLOCK_SIZE = 16
# The emulated pool may take at most this share of this machine's memory: the rest is
# for the weights, activations, the UI and the other users of a shared box.
MAX_MEMORY_SHARE = 0.4
EMBEDDED_GEOMETRY = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EmulationPlan:
    engine_argv: list[str]
    info: EmulationInfo
    pool_blocks: int
    block_size: int
    kv_cache_memory_bytes: int


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        spelled = arg.replace("_", "-")
        if spelled == name and i + 1 < len(argv):
            return argv[i + 1]
        if spelled.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _describe(g: ModelGeometry) -> str:
    return (
        f"{g.name}: {g.num_layers} layers x {g.num_kv_heads} KV heads x {g.head_dim} x "
        f"{g.dtype_bytes} B x 2 = {g.kv_bytes_per_token:,} B/token"
    )


def plan_emulation(
    gpu: str,
    model: str,
    engine_argv: Sequence[str],
    *,
    scale: float = 1.0,
    on_gpu: bool = False,
    memory_bytes: int | None = None,
) -> EmulationPlan:
    """Engine flags that give the local engine the emulated pool, and what to show."""
    if not 0 < scale <= 1:
        raise BadOption("--emulate-scale", f"{scale} is not in (0, 1]")
    for conflicting in ("--kv-cache-memory-bytes", "--num-gpu-blocks-override"):
        if _flag(engine_argv, conflicting) is not None:
            raise BadOption(conflicting, "cannot be combined with --emulate-gpu, which sets it")
    hw = load_profile(gpu, option="--emulate-gpu")
    target = load_geometry(model, option="--emulate-model")
    local_model = _flag(engine_argv, "--model")
    local = load_geometry(local_model or EMBEDDED_GEOMETRY, option="--model")
    block_size = int(
        _flag(engine_argv, "--block-size") or (GPU_BLOCK_SIZE if on_gpu else CPU_BLOCK_SIZE)
    )

    tokens = emulated_pool_tokens(target, hw)
    if tokens <= 0:
        raise BadOption(
            "--emulate-gpu",
            f"{target.name} does not fit on {hw.name} at all: its weights alone take "
            f"{target.weight_bytes / 1e9:.1f} GB of {hw.memory_bytes / 1e9:.1f} GB",
        )
    wanted_blocks = int(tokens * scale) // block_size
    # vLLM keeps one block back as its null block, so ask for one more.
    bytes_needed = (wanted_blocks + 1) * block_size * local.kv_bytes_per_token
    budget = int((memory_bytes or total_memory_bytes()) * MAX_MEMORY_SHARE)
    if bytes_needed > budget:
        fits = budget / ((int(tokens) // block_size + 1) * block_size * local.kv_bytes_per_token)
        best = math.floor(fits * 100) / 100
        raise BadOption(
            "--emulate-gpu",
            f"the {hw.name} pool of {tokens:,} tokens for {target.name} needs "
            f"{bytes_needed / 2**30:.1f} GiB of KV for {local.name} here, more than the "
            f"{budget / 2**30:.1f} GiB this machine can spare; --emulate-scale {best:g} "
            "is the largest that fits",
        )
    pool_tokens = wanted_blocks * block_size
    info = EmulationInfo(
        gpu=hw.name.replace("NVIDIA ", ""),
        model=target.name.split("/")[-1],
        pool_tokens=pool_tokens,
        kv_bytes_per_token=target.kv_bytes_per_token,
        scale=scale,
        detail=f"emulated {_describe(target)}; running {_describe(local)}",
    )
    argv = [*engine_argv, "--kv-cache-memory-bytes", str(bytes_needed)]
    return EmulationPlan(argv, info, wanted_blocks, block_size, bytes_needed)
