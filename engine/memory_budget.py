"""Where an engine's memory went: weights, activations, KV pool, the rest, and what is free.

"Why is the pool 80k tokens on an L4?" reads off one bar: the GPU's memory, the share vLLM
may take (`--gpu-memory-utilization`), and within it the weights, the profiling run's peak
activations and the KV pool, each from vLLM's own accounting where it has one.

vLLM's weights figure is checked against the model's parameter count x dtype size: on the
CPU backend vLLM keeps no figure, and the loaded tensors kvscope then counts miss every
linear layer whose weight vLLM handed to oneDNN (AVX-512 machines: only the embeddings
stay torch tensors, 57.7 MB of SmolLM2-135M's 269 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.byte_size import figure, in_unit
from engine.errors import BadOption
from engine.model_geometry import count_parameters
from engine.sizes import GIB as GIB  # re-exported: the tests size their budgets in it

if TYPE_CHECKING:
    from collections.abc import Mapping

# How far vLLM's weights figure may stray from parameters x dtype size before the config's
# figure is shown instead. Loose on purpose: the count knows Llama/Qwen-style layers only
# (GPT-2's two-matrix MLP is 2/3 of a gated one), and vLLM adds small buffers (the rotary
# cos/sin cache); a figure more than 2x off is a measurement that missed the weights.
DISAGREEMENT = 2.0

VLLM_ACCOUNTING = "vLLM's start-up accounting"
LOADED_TENSORS = "the loaded tensors"


@dataclass(frozen=True, slots=True)
class ConfigWeights:
    """The weights a model's config implies: its parameters at the dtype it runs in."""

    parameters: int
    dtype_bytes: int

    @property
    def bytes(self) -> int:
        return self.parameters * self.dtype_bytes

    def words(self) -> str:
        """ "the model's config (134,515,008 parameters x 2 B)"."""
        return f"the model's config ({self.parameters:,} parameters x {self.dtype_bytes} B)"


def config_weights(cfg: Mapping[str, Any], dtype_bytes: int) -> ConfigWeights | None:
    """The config's weights, or None where the count does not describe the model
    (mixture of experts, a size the config leaves out)."""
    try:
        return ConfigWeights(count_parameters(cfg), dtype_bytes)
    except BadOption:
        return None


def choose_weights(
    reported: int | None, reported_by: str, config: ConfigWeights | None
) -> tuple[int, str]:
    """The weights figure to show and where it came from.

    `reported` (vLLM's figure, or the loaded tensors counted) is kept while it is within
    `DISAGREEMENT` of the config's figure either way; beyond that, or when there is no
    figure at all, the config's is shown and the words say what the other one was.
    """
    if config is None:
        return int(reported or 0), reported_by
    expected = config.bytes
    if reported and expected / DISAGREEMENT <= reported <= expected * DISAGREEMENT:
        return int(reported), reported_by
    if not reported:
        return expected, f"{config.words()}: {reported_by} gave none"
    return expected, (
        f"{config.words()}: {reported_by} gave {in_unit(reported, 'MiB', 1, grouped=True)}, "
        f"more than {DISAGREEMENT:g}x off"
    )


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
    source: str = VLLM_ACCOUNTING
    """Where the weights figure came from (`choose_weights`): vLLM's start-up accounting,
    the loaded tensors, or the model's config when the other figure was more than 2x off."""
    pool_fixed: bool = False
    """--kv-cache-memory-bytes set the pool on a GPU: vLLM then skips its profiling
    accounting (no activations figure) and allocates only what it needs, so
    `requested_bytes` is the start-up check's threshold, not memory vLLM holds."""

    @property
    def other_bytes(self) -> int | None:
        """What vLLM's share holds beyond weights, activations and pool (CUDA graphs,
        the allocator's slack, the NCCL buffers); None where vLLM holds no share (the
        CPU backend, a fixed pool) and the difference would be memory nobody took."""
        if self.requested_bytes is None or self.pool_fixed:
            return None
        used = self.weights_bytes + (self.activations_bytes or 0) + self.kv_pool_bytes
        return max(0, self.requested_bytes - used)

    @property
    def free_bytes(self) -> int | None:
        """Memory outside vLLM's share (other processes may hold some of it). With a fixed
        pool, the device's memory beyond the weights and pool: vLLM's activations and CUDA
        graphs sit in it too, uncounted, so the bar calls it "not counted"."""
        if self.total_bytes is None:
            return None
        taken = self.requested_bytes
        if taken is None or self.pool_fixed:
            taken = self.weights_bytes + (self.activations_bytes or 0) + self.kv_pool_bytes
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
            parts.append(("not counted" if self.pool_fixed else "free", self.free_bytes))
        return parts

    def words(self) -> str:
        """ "weights 15.2 · activations 1.1 · KV pool 4.4 (80,384 tok) · other 0.9 · free
        2.4 of 24.0 GiB (an emulated NVIDIA L4); weights from vLLM's start-up accounting"."""
        bits = []
        for name, size in self.parts():
            bit = f"{name} {_gib(size)}"
            if name == "KV pool":
                bit += f" ({self.kv_pool_tokens:,} tok)"
            bits.append(bit)
        whole = f" of {_gib(self.total_bytes)} GiB" if self.total_bytes else " GiB"
        where = self.device + (", per rank" if self.per_rank else "")
        if self.pool_fixed:
            where += "; pool fixed by --kv-cache-memory-bytes, so vLLM measured no activations"
        return f"{' · '.join(bits)}{whole} ({where}); weights from {self.source}"


def _gib(n: int | None) -> str:
    """A bar figure in GiB, its unit named once at the end of the bar: two places below
    10 GiB ("2.40"), one from there up ("24.0"), so every figure keeps about three digits."""
    if n is None:
        return "?"
    return figure(n, "GiB", 2 if n / GIB < 10 else 1, grouped=True)
