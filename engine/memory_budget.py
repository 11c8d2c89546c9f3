"""Where an engine's memory went: weights, activations, KV pool, the rest, and what is free.

"Why is the pool 80k tokens on an L4?" reads off one bar: the GPU's memory, the share vLLM
may take (`--gpu-memory-utilization`), and within it the weights, the profiling run's peak
activations and the KV pool, each from vLLM's own accounting where it has one.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """One device's memory at engine start-up (one rank's under tensor or pipeline
    parallelism: each rank holds its own share of weights and pool)."""

    device: str
    """"GPU 0 (NVIDIA L4)", "this machine's RAM", "an emulated NVIDIA L4"."""
    total_bytes: int | None
    requested_bytes: int | None
    """The share vLLM may use (total x --gpu-memory-utilization); None on the CPU backend,
    which sizes its pool from --kv-cache-memory-bytes alone."""
    weights_bytes: int
    activations_bytes: int | None
    """The peak of vLLM's profiling run (GPU only)."""
    kv_pool_bytes: int
    kv_pool_tokens: int
    per_rank: bool = False
    source: str = "vLLM's start-up accounting"

    @property
    def other_bytes(self) -> int | None:
        """What vLLM's share holds beyond weights, activations and pool (CUDA graphs,
        the allocator's slack, the NCCL buffers)."""
        if self.requested_bytes is None:
            return None
        used = self.weights_bytes + (self.activations_bytes or 0) + self.kv_pool_bytes
        return max(0, self.requested_bytes - used)

    @property
    def free_bytes(self) -> int | None:
        """Memory outside vLLM's share (other processes may hold some of it)."""
        if self.total_bytes is None:
            return None
        taken = self.requested_bytes
        if taken is None:
            taken = self.weights_bytes + self.kv_pool_bytes
        return max(0, self.total_bytes - taken)

    def parts(self) -> list[tuple[str, int]]:
        """The bar's segments in order, in bytes (those that are known)."""
        parts = [("weights", self.weights_bytes)]
        if self.activations_bytes is not None:
            parts.append(("activations", self.activations_bytes))
        parts.append(("KV pool", self.kv_pool_bytes))
        if self.other_bytes is not None:
            parts.append(("other", self.other_bytes))
        if self.free_bytes is not None:
            parts.append(("free", self.free_bytes))
        return parts

    def words(self) -> str:
        """ "weights 15.2 · activations 1.1 · KV pool 4.4 (80,384 tok) · other 0.9 · free
        2.4 of 24.0 GiB (an emulated NVIDIA L4)"."""
        bits = []
        for name, size in self.parts():
            bit = f"{name} {_gib(size)}"
            if name == "KV pool":
                bit += f" ({self.kv_pool_tokens:,} tok)"
            bits.append(bit)
        whole = f" of {_gib(self.total_bytes)} GiB" if self.total_bytes else " GiB"
        rank = ", per rank" if self.per_rank else ""
        return f"{' · '.join(bits)}{whole} ({self.device}{rank})"


def _gib(n: int | None) -> str:
    if n is None:
        return "?"
    v = n / GIB
    return f"{v:,.2f}" if v < 10 else f"{v:,.1f}"
