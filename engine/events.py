"""The plain, frozen values that cross the engine boundary.

The UI, `kvscope generate`, `kvscope bench` and the tests only ever see these; no vLLM
object leaves `engine/`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    max_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = False
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One request: either chat messages (rendered by the model's chat template) or exact
    token IDs, which is how the prompt-length slider and sweeps get exact lengths."""

    request_id: str
    messages: tuple[ChatMessage, ...] = ()
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)


@dataclass(frozen=True, slots=True)
class RequestAccepted:
    """The engine took the request; `submitted_at` is on the engine's clock."""

    request_id: str
    prompt_tokens: int
    submitted_at: float


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New tokens of one request, produced by one engine step.

    `time_s` is when that step ended on the engine's clock, not when the UI got the event:
    latency is the engine's, whatever the consumer's own delays.
    """

    request_id: str
    index: int  # position of the first of `token_ids` in the output
    token_ids: tuple[int, ...]
    text: str
    step: int
    time_s: float
    latency_s: float  # since the previous token, or since submission for the first


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request_id: str
    reason: str  # "stop", "length" or "abort"
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    preemptions: int = 0


EngineEvent = RequestAccepted | TokenEvent | RequestFinished


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """The physical KV blocks one live request holds after a step."""

    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int  # tokens whose KV is in those blocks


@dataclass(frozen=True, slots=True)
class StepSample:
    """What one engine step did, measured by the thread that ran it."""

    step: int
    started_at: float
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    kv_usage: float  # 0..1
    free_blocks: int
    total_blocks: int
    block_size: int
    blocks: tuple[RequestBlocks, ...] = ()
    preemptions: int = 0
    preempted_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EmulationInfo:
    """Set when the KV pool is sized as a given model would get on a given GPU."""

    gpu: str
    model: str
    pool_tokens: int
    kv_bytes_per_token: int
    scale: float = 1.0  # < 1 when this machine could only afford part of that pool
    detail: str = ""  # both geometries, in words

    @property
    def label(self) -> str:
        scaled = "" if self.scale >= 1.0 else f" at {self.scale:.0%} scale"
        return f"emulating {self.gpu} / {self.model}{scaled}"


@dataclass(frozen=True, slots=True)
class ModelCard:
    name: str
    path: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_bytes_per_token: int
    max_model_len: int
    block_size: int
    total_blocks: int
    device: str
    emulation: EmulationInfo | None = None

    @property
    def kv_pool_tokens(self) -> int:
        return self.total_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """A stage of engine start-up, with its share of the whole (0..1)."""

    stage: str
    fraction: float


ProgressCallback = Callable[[LoadProgress], None]
StepListener = Callable[[StepSample], None]
