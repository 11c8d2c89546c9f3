"""First-principles floors for latency and KV memory: the "roofline".

Every number here is arithmetic on two things: a model's geometry (from its `config.json`)
and a machine's peak numbers (FLOP/s, memory bandwidth, memory size). No engine runs.

The two floors follow the roofline model:

* **Prefill (TTFT)** does about 2 FLOPs per parameter per prompt token, all tokens at once,
  so it is limited by peak FLOP/s (compute-bound) except for very short prompts.
* **Decode (ITL)** produces one token per request per step, but must stream every weight
  (and the request's KV cache) from memory each step, so it is limited by memory
  bandwidth (memory-bound) until the batch is large.

Each floor is the larger of the compute time and the memory time, at 100% of the vendor's
peak (for "cpu", the fastest this machine was measured to go): a real engine lands above
it, always. `percent_of_floor` says how close a measurement comes; a measurement below its
floor is a bug in the floor's inputs, said as such (`floor_share_words`).

The KV pool is what vLLM has left for the cache after weights and a reserve for
activations, out of `memory * gpu_memory_utilization`.

The machine's numbers are a `roofline.hardware_profile.HardwareProfile`, the model's a
`roofline.geometry.ModelGeometry`. Pure Python on purpose: the TUI, the CLI and the tests
import it without torch or vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption
from engine.sizes import MIB
from roofline.geometry import ModelGeometry
from roofline.hardware_profile import HardwareProfile

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# vLLM's default KV block size on CUDA (the CPU backend uses 128). The pool is a whole
# number of blocks, and every request holds whole blocks, so capacities round to it.
CUDA_BLOCK_SIZE = 16

# What vLLM's memory profiling run pushes through the model at start-up: one batch of
# `max_num_batched_tokens` tokens (8,192 is vLLM's default for the OpenAI server and for
# `LLM` on GPUs that are not top-end) and a sampler pass over `max_num_seqs` sequences.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256

# Memory vLLM's budget loses that is neither weights, KV, nor the profiled activation
# peak: the CUDA context, cuBLAS/NCCL workspaces, CUDA graphs and allocator fragmentation.
# 768 MiB was chosen so that Qwen2.5-7B-Instruct on an L4 at gpu_memory_utilization=0.9
# gets the ~4.3 GiB (~80k-token) pool vLLM is observed to allocate there.
DEFAULT_FIXED_OVERHEAD_BYTES = 768 * MIB


# --------------------------------------------------------------------------- FLOPs


def _check_len(value: int, what: str, minimum: int = 0) -> None:
    if value < minimum:
        raise BadOption(what, f"must be at least {minimum} (got {value})")


def prefill_flops(geom: ModelGeometry, prompt_len: int) -> int:
    """FLOPs to prefill `prompt_len` tokens and produce the first token's logits.

    * Matmuls: 2 FLOPs (multiply + add) per non-embedding parameter per token. The input
      embedding is a lookup, not a matmul.
    * Attention: QK^T and AV each cost 2 * head_dim FLOPs per (query, key) pair per head
      per layer. With a causal mask a query at position p sees p+1 keys, so there are
      L*(L+1)/2 pairs, not L^2: FlashAttention-style kernels skip the masked half, and a
      floor should count only the work that must be done.
    * lm_head: vLLM computes logits for the last prompt position only (that is the first
      output token), so 2 * vocab * hidden once, not per prompt token.
    """
    _check_len(prompt_len, "prompt length")
    matmuls = 2 * geom.non_embedding_params * prompt_len
    pairs = prompt_len * (prompt_len + 1) // 2
    attention = 2 * 2 * geom.num_layers * geom.num_attention_heads * geom.head_dim * pairs
    logits = 2 * geom.vocab_size * geom.hidden_size if prompt_len > 0 else 0
    return matmuls + attention + logits


def decode_flops_per_token(geom: ModelGeometry, context_len: int) -> int:
    """FLOPs for one decode step of one request whose KV cache holds `context_len` tokens.

    The single new query attends to every cached key (no causal saving), and the lm_head
    runs for the new token.
    """
    _check_len(context_len, "context length")
    matmuls = 2 * geom.non_embedding_params
    attention = 2 * 2 * geom.num_layers * geom.num_attention_heads * geom.head_dim * context_len
    logits = 2 * geom.vocab_size * geom.hidden_size
    return matmuls + attention + logits


# --------------------------------------------------------------------------- floors


def prefill_compute_s(geom: ModelGeometry, hw: HardwareProfile, prompt_len: int) -> float:
    return prefill_flops(geom, prompt_len) / hw.peak_bf16_flops


def prefill_memory_s(geom: ModelGeometry, hw: HardwareProfile, prompt_len: int) -> float:
    # Prefill still has to read every weight once and write the prompt's KV.
    moved = geom.weight_bytes + prompt_len * geom.kv_bytes_per_token
    return moved / hw.mem_bandwidth_bytes_s


def ttft_floor_s(geom: ModelGeometry, hw: HardwareProfile, prompt_len: int) -> float:
    """Fastest possible time to first token: one prefill step at peak.

    This is prefill_flops / peak FLOP/s for any prompt long enough to be compute-bound
    (on an L4 with a 7B model, anything over ~500 tokens); for shorter prompts the time to
    stream the weights once is the real floor, so the larger of the two is returned.
    """
    return max(prefill_compute_s(geom, hw, prompt_len), prefill_memory_s(geom, hw, prompt_len))


def ttft_bound(geom: ModelGeometry, hw: HardwareProfile, prompt_len: int) -> str:
    """Which roof sets the TTFT floor: "compute" or "memory"."""
    compute = prefill_compute_s(geom, hw, prompt_len)
    return "compute" if compute >= prefill_memory_s(geom, hw, prompt_len) else "memory"


def itl_floor_s(
    geom: ModelGeometry, hw: HardwareProfile, context_len: int, batch: int = 1
) -> float:
    """Fastest possible decode step (inter-token latency) at a given KV context length.

    Each step streams every weight once (shared by the batch) plus each request's own
    KV cache: (weight_bytes + batch * kv_bytes_per_token * context_len) / bandwidth.
    Weight bytes count all parameters, including the input embedding table, which a
    decode step only touches one row of: for an untied model this overstates the floor
    slightly (1.1 GB, ~3.6 ms, for Qwen2.5-7B on an L4) but matches the way the floor is
    usually quoted. At large batches the matmul FLOPs take over, hence the max.
    """
    _check_len(context_len, "context length")
    _check_len(batch, "batch", minimum=1)
    memory = (
        geom.weight_bytes + batch * geom.kv_bytes_per_token * context_len
    ) / hw.mem_bandwidth_bytes_s
    compute = batch * decode_flops_per_token(geom, context_len) / hw.peak_bf16_flops
    return max(memory, compute)


def percent_of_floor(measured_s: float, floor_s: float) -> float:
    """How close a measurement comes to its floor: floor / measured * 100.

    100% would be a perfect engine running at the hardware's peak, so the number says how
    much of the machine the engine used. Above 100% the measurement beat its floor, which
    no engine can do: the floor's inputs (the peak numbers, the FLOP count) are wrong for
    that machine, and `floor_beaten` says so (a share is never shown above 100%).
    """
    if measured_s <= 0:
        raise ValueError(f"measured time must be positive, got {measured_s}")
    return floor_s / measured_s * 100.0


FLOOR_BEATEN = "floor beaten: calibration is wrong"
"""What is shown instead of a share above 100%: the floor is a bug, not a result."""


def floor_beaten(percent: float | None) -> bool:
    """Whether a share of the floor (`percent_of_floor`) says the measurement beat it."""
    return percent is not None and percent > 100.0


def floor_share_words(percent: float | None, *, short: bool = False) -> str:
    """A share of the floor for a table cell: "43%", "-" when there is none, and for a
    measurement faster than its floor `FLOOR_BEATEN` (or "beaten ✗" when `short`)."""
    if percent is None:
        return "-"
    if floor_beaten(percent):
        return "beaten ✗" if short else FLOOR_BEATEN
    return f"{percent:.0f}%"


# --------------------------------------------------------------------------- KV pool


def _check_util(gpu_memory_utilization: float) -> None:
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise BadOption(
            "--gpu-memory-utilization",
            f"must be above 0 and at most 1 (got {gpu_memory_utilization})",
        )


def default_activation_reserve_bytes(
    geom: ModelGeometry,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    fixed_overhead_bytes: int = DEFAULT_FIXED_OVERHEAD_BYTES,
) -> int:
    """Memory vLLM keeps back from the KV pool besides the weights.

    vLLM measures its peak activation memory with one profiling forward pass of
    `max_num_batched_tokens` tokens. In a gated MLP the largest live tensors are the
    gate/up output (2 * intermediate_size per token) and the activated product
    (intermediate_size per token), so the estimate is
    `tokens * 3 * intermediate_size * dtype_bytes`, plus float32 logits for the sampler's
    `max_num_seqs` sequences, plus a fixed overhead (see DEFAULT_FIXED_OVERHEAD_BYTES).
    """
    mlp_peak = max_num_batched_tokens * 3 * geom.intermediate_size * geom.dtype_bytes
    logits = max_num_seqs * geom.vocab_size * 4
    return mlp_peak + logits + fixed_overhead_bytes


def _pool_bytes_signed(
    geom: ModelGeometry,
    hw: HardwareProfile,
    gpu_memory_utilization: float,
    activation_reserve_bytes: int | None,
) -> int:
    _check_util(gpu_memory_utilization)
    reserve = (
        default_activation_reserve_bytes(geom)
        if activation_reserve_bytes is None
        else activation_reserve_bytes
    )
    budget = int(hw.memory_bytes * gpu_memory_utilization)
    return budget - geom.weight_bytes - reserve


def weights_fit(
    geom: ModelGeometry,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
) -> bool:
    """Whether weights plus the reserve fit in the budget at all (vLLM starts)."""
    return _pool_bytes_signed(geom, hw, gpu_memory_utilization, activation_reserve_bytes) > 0


def kv_pool_bytes(
    geom: ModelGeometry,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
) -> int:
    """Bytes left for the KV cache: memory * utilization - weights - reserve (never < 0).

    `activation_reserve_bytes=None` uses `default_activation_reserve_bytes(geom)`.
    """
    return max(0, _pool_bytes_signed(geom, hw, gpu_memory_utilization, activation_reserve_bytes))


def kv_pool_tokens(
    geom: ModelGeometry,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    block_size: int = CUDA_BLOCK_SIZE,
) -> int:
    """Tokens the KV pool holds, in whole blocks as vLLM allocates it."""
    _check_len(block_size, "block size", minimum=1)
    pool = kv_pool_bytes(geom, hw, gpu_memory_utilization, activation_reserve_bytes)
    blocks = pool // (geom.kv_bytes_per_token * block_size)
    return blocks * block_size


def max_single_prompt_tokens(
    geom: ModelGeometry,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    block_size: int = CUDA_BLOCK_SIZE,
) -> int:
    """The longest single request (prompt + output): the pool or the model's context."""
    pool = kv_pool_tokens(geom, hw, gpu_memory_utilization, activation_reserve_bytes, block_size)
    return min(pool, geom.max_position_embeddings)


def concurrent_requests(
    geom: ModelGeometry,
    hw: HardwareProfile,
    length: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    block_size: int = CUDA_BLOCK_SIZE,
) -> int:
    """How many requests of `length` tokens (prompt + output) fit in the pool at once.

    Each request holds whole blocks. This is the KV limit only: vLLM's scheduler also caps
    running requests at `max_num_seqs` (256 by default). 0 when one request does not fit.
    """
    _check_len(length, "request length", minimum=1)
    if length > geom.max_position_embeddings:
        return 0
    pool = kv_pool_tokens(geom, hw, gpu_memory_utilization, activation_reserve_bytes, block_size)
    per_request = math.ceil(length / block_size) * block_size
    return pool // per_request


def emulated_pool_tokens(geom: ModelGeometry, hw: HardwareProfile, util: float = 0.9) -> int:
    """The token capacity a local engine's pool should get to behave like `geom` on `hw`."""
    return kv_pool_tokens(geom, hw, util)


# --------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class Prediction:
    """The floors for one prompt length."""

    prompt_len: int
    ttft_floor_s: float
    itl_floor_s: float  # mean over the output: the floor at the midpoint context
    prefill_flops: int
    kv_bytes: int  # the prompt's KV cache
    fits: bool  # prompt + output fits in the pool and the model's context
    concurrent: int  # requests of prompt + output tokens whose KV fits at once
    output_len: int = 0
    ttft_bound: str = "compute"  # which roof sets the TTFT floor
    request_kv_bytes: int = 0  # KV of prompt + output, what the request ends up holding

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prediction:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class RooflineReport:
    geometry: ModelGeometry
    hardware: HardwareProfile
    gpu_memory_utilization: float
    output_len: int
    block_size: int
    weight_bytes: int
    kv_bytes_per_token: int
    activation_reserve_bytes: int
    weights_fit: bool
    kv_pool_bytes: int
    kv_pool_tokens: int
    max_single_prompt_tokens: int
    starts_at_default_max_model_len: bool  # pool holds one max_position_embeddings request
    predictions: tuple[Prediction, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists, numbers and strings: ready for `json.dumps`."""
        return {
            "geometry": self.geometry.to_dict(),
            "hardware": self.hardware.to_dict(),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "output_len": self.output_len,
            "block_size": self.block_size,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "activation_reserve_bytes": self.activation_reserve_bytes,
            "weights_fit": self.weights_fit,
            "kv_pool_bytes": self.kv_pool_bytes,
            "kv_pool_tokens": self.kv_pool_tokens,
            "max_single_prompt_tokens": self.max_single_prompt_tokens,
            "starts_at_default_max_model_len": self.starts_at_default_max_model_len,
            "predictions": [p.to_dict() for p in self.predictions],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RooflineReport:
        return cls(
            geometry=ModelGeometry.from_dict(data["geometry"]),
            hardware=HardwareProfile.from_dict(data["hardware"]),
            gpu_memory_utilization=float(data["gpu_memory_utilization"]),
            output_len=int(data["output_len"]),
            block_size=int(data["block_size"]),
            weight_bytes=int(data["weight_bytes"]),
            kv_bytes_per_token=int(data["kv_bytes_per_token"]),
            activation_reserve_bytes=int(data["activation_reserve_bytes"]),
            weights_fit=bool(data["weights_fit"]),
            kv_pool_bytes=int(data["kv_pool_bytes"]),
            kv_pool_tokens=int(data["kv_pool_tokens"]),
            max_single_prompt_tokens=int(data["max_single_prompt_tokens"]),
            starts_at_default_max_model_len=bool(data["starts_at_default_max_model_len"]),
            predictions=tuple(Prediction.from_dict(p) for p in data["predictions"]),
        )


def predict(
    geom: ModelGeometry,
    hw: HardwareProfile,
    prompt_lens: Sequence[int],
    output_len: int = 128,
    util: float = 0.9,
    *,
    activation_reserve_bytes: int | None = None,
    block_size: int = CUDA_BLOCK_SIZE,
) -> RooflineReport:
    """Floors and KV capacity for each prompt length, one request at a time."""
    if not prompt_lens:
        raise BadOption("--prompt-lens", "give at least one prompt length")
    for n in prompt_lens:
        if n < 1:
            raise BadOption("--prompt-lens", f"prompt lengths must be positive (got {n})")
    if output_len < 1:
        raise BadOption("--output-len", f"must be at least 1 (got {output_len})")
    _check_util(util)
    reserve = (
        default_activation_reserve_bytes(geom)
        if activation_reserve_bytes is None
        else activation_reserve_bytes
    )
    pool_tokens = kv_pool_tokens(geom, hw, util, reserve, block_size)
    longest = min(pool_tokens, geom.max_position_embeddings)

    predictions = []
    for n in prompt_lens:
        total = n + output_len
        # ITL grows linearly with context, so its mean over the output tokens is its
        # value at the midpoint of generation.
        mid_context = n + output_len // 2
        predictions.append(
            Prediction(
                prompt_len=n,
                ttft_floor_s=ttft_floor_s(geom, hw, n),
                itl_floor_s=itl_floor_s(geom, hw, mid_context),
                prefill_flops=prefill_flops(geom, n),
                kv_bytes=n * geom.kv_bytes_per_token,
                fits=total <= longest,
                concurrent=concurrent_requests(geom, hw, total, util, reserve, block_size),
                output_len=output_len,
                ttft_bound=ttft_bound(geom, hw, n),
                request_kv_bytes=total * geom.kv_bytes_per_token,
            )
        )
    return RooflineReport(
        geometry=geom,
        hardware=hw,
        gpu_memory_utilization=util,
        output_len=output_len,
        block_size=block_size,
        weight_bytes=geom.weight_bytes,
        kv_bytes_per_token=geom.kv_bytes_per_token,
        activation_reserve_bytes=reserve,
        weights_fit=weights_fit(geom, hw, util, reserve),
        kv_pool_bytes=kv_pool_bytes(geom, hw, util, reserve),
        kv_pool_tokens=pool_tokens,
        max_single_prompt_tokens=longest,
        starts_at_default_max_model_len=pool_tokens >= geom.max_position_embeddings,
        predictions=tuple(predictions),
    )
