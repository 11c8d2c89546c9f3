"""The roofline of batched decode: what a step costs at batch b and context c.

One decode step streams every weight once, shared by the whole batch, plus each
request's own KV cache, and does one token's FLOPs per request:

    step time ~ max((weights + b x KV bytes at c) / bandwidth, b x decode FLOPs at c / peak)

While the memory term wins, a batch of 32 costs barely more per step than a batch of 1,
so throughput (b / step time) grows almost linearly with b: decode is memory-bound. The
batch where the compute term catches up is where that stops; the KV pool caps the batch
sooner on a small GPU. The step is `roofline.floors.itl_floor_s` at that batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from roofline.floors import (
    CUDA_BLOCK_SIZE,
    concurrent_requests,
    decode_flops_per_token,
    itl_floor_s,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from roofline.geometry import ModelGeometry
    from roofline.hardware_profile import HardwareProfile


@dataclass(frozen=True, slots=True)
class BatchedStep:
    """The floor of one decode step of `batch` requests whose KV holds `context` tokens."""

    batch: int
    context: int
    step_s: float
    memory_s: float
    compute_s: float
    tokens_per_s: float  # batch / step: the ceiling on output throughput
    bound: str  # "memory" or "compute"
    fits: bool  # the KV pool holds `batch` requests of `context` tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_s(geom: ModelGeometry, hw: HardwareProfile, batch: int, context: int) -> float:
    return (geom.weight_bytes + batch * geom.kv_bytes_per_token * context) / (
        hw.mem_bandwidth_bytes_s
    )


def compute_s(geom: ModelGeometry, hw: HardwareProfile, batch: int, context: int) -> float:
    return batch * decode_flops_per_token(geom, context) / hw.peak_bf16_flops


def batched_step(
    geom: ModelGeometry,
    hw: HardwareProfile,
    batch: int,
    context: int,
    *,
    util: float = 0.9,
    block_size: int = CUDA_BLOCK_SIZE,
) -> BatchedStep:
    step = itl_floor_s(geom, hw, context, batch=batch)
    mem, comp = memory_s(geom, hw, batch, context), compute_s(geom, hw, batch, context)
    return BatchedStep(
        batch=batch,
        context=context,
        step_s=step,
        memory_s=mem,
        compute_s=comp,
        tokens_per_s=batch / step,
        bound="compute" if comp >= mem else "memory",
        fits=batch <= max_batch_in_pool(geom, hw, context, util=util, block_size=block_size),
    )


def compute_bound_batch(geom: ModelGeometry, hw: HardwareProfile, context: int) -> int | None:
    """The smallest batch whose decode step is compute-bound at `context`; None when the
    KV each request adds costs more time to read than its FLOPs take (never compute-bound).

    Solves b x F / peak >= (W + b x K x c) / bw for b.
    """
    per_request = decode_flops_per_token(geom, context) / hw.peak_bf16_flops
    per_request -= geom.kv_bytes_per_token * context / hw.mem_bandwidth_bytes_s
    if per_request <= 0:
        return None
    return max(1, math.ceil(geom.weight_bytes / hw.mem_bandwidth_bytes_s / per_request))


def max_batch_in_pool(
    geom: ModelGeometry,
    hw: HardwareProfile,
    context: int,
    *,
    util: float = 0.9,
    block_size: int = CUDA_BLOCK_SIZE,
) -> int:
    """The most requests of `context` tokens whose KV the pool holds at once."""
    return concurrent_requests(geom, hw, context, util, block_size=block_size)


@dataclass(frozen=True, slots=True)
class BatchedReport:
    context: int
    steps: tuple[BatchedStep, ...]
    compute_bound_batch: int | None
    max_batch_in_pool: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "compute_bound_batch": self.compute_bound_batch,
            "max_batch_in_pool": self.max_batch_in_pool,
            "steps": [s.to_dict() for s in self.steps],
        }

    def sentence(self) -> str:
        """What the numbers say, in one sentence."""
        first, last = self.steps[0], self.steps[-1]
        grow = last.tokens_per_s / first.tokens_per_s
        head = (
            f"At {self.context:,} tokens of context, batch {first.batch} -> {last.batch} "
            f"raises the decode ceiling x{grow:.1f} ({first.tokens_per_s:,.0f} -> "
            f"{last.tokens_per_s:,.0f} tokens/s) while a step costs "
            f"x{last.step_s / first.step_s:.2f}"
        )
        if self.compute_bound_batch is None:
            turn = "; decode stays memory-bound at every batch (the KV it reads grows as fast)"
        else:
            turn = f"; decode turns compute-bound at batch {self.compute_bound_batch:,}"
        return head + turn + f"; the KV pool holds {self.max_batch_in_pool:,} such requests."


def batched_report(
    geom: ModelGeometry,
    hw: HardwareProfile,
    batches: Sequence[int],
    context: int,
    *,
    util: float = 0.9,
    block_size: int = CUDA_BLOCK_SIZE,
) -> BatchedReport:
    steps = tuple(
        batched_step(geom, hw, b, context, util=util, block_size=block_size) for b in batches
    )
    return BatchedReport(
        context=context,
        steps=steps,
        compute_bound_batch=compute_bound_batch(geom, hw, context),
        max_batch_in_pool=max_batch_in_pool(geom, hw, context, util=util, block_size=block_size),
    )


def throughput_ceiling(
    geom: ModelGeometry, hw: HardwareProfile, context: int
) -> Callable[[int], float]:
    """Output tokens/s at a decode batch, for drawing measured load points against."""

    def ceiling(batch: int) -> float:
        return batch / itl_floor_s(geom, hw, context, batch=max(batch, 1))

    return ceiling
