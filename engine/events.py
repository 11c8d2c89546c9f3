"""The plain, frozen values that cross the engine boundary.

The UI, `kvscope generate`, `kvscope bench` and the tests only ever see these; no vLLM
object leaves `engine/`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]
"""Why a request ended: a stop token or string, max_tokens reached, or aborted."""

EngineState = Literal["loading", "ready", "failed", "dead"]
"""An engine's life: loading (start() runs), ready, failed (start() raised), dead (it
stopped after being ready). `tui/format.py` is the one place that turns it into words."""

WallKind = Literal["context", "pool", "concurrency"]
"""The walls the prompt-length slider draws: max_model_len, the KV pool, requests at once."""


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
class ReplicaServed:
    """Which replica of a fleet served a request, and where its prefix was cached then
    (engine/fleet): words for the reply's footer, each naming what it rests on."""

    replica: str | None  # None: not known
    served: str  # "served by b (router counter)", or why it is not known
    prefix: str = ""  # "prefix: 412 of 430 tokens cached on replica b"; "" if not known

    def words(self) -> tuple[str, ...]:
        """What a reply's footer and `kvscope generate` say: the prefix, then the replica."""
        return (self.prefix, self.served) if self.prefix else (self.served,)


@dataclass(frozen=True, slots=True)
class HandOff:
    """A disaggregated request's two halves (engine/fleet/disaggregated.py): its prompt
    prefilled on one server, its KV cache handed to another, which decodes it.

    Times are the client's, from the moment the caller asked (as every TTFT here):
    `prefill_s` to the prefill server's whole answer (its queue, its prefill, one token,
    the network); `handoff_s` from that answer to the decode server's first token: the KV
    transfer and the decode server's first step, which no server reports apart with
    the connector kvscope can see (`transfer_s` is the connector's own time, where it
    exports one).
    """

    prefill_replica: str
    decode_replica: str
    prompt_tokens: int
    prefill_s: float
    handoff_s: float | None  # None: no token came from the decode server
    loaded_tokens: int | None
    """Prompt tokens the decode server did not compute: its KV came from elsewhere."""
    loaded_source: str  # what `loaded_tokens` rests on, in words
    block_size: int | None = None
    kv_bytes_per_token: int | None = None
    transfer_s: float | None = None
    transfer_bytes: int | None = None
    prefill_server: ServerTimings | None = None
    """The prefill server's own figures (its per-request metrics), where it sends them:
    its queue, and its TTFT, which is the prefill itself."""

    @property
    def recomputed_tokens(self) -> int | None:
        """Prompt tokens the decode server computed again (at least the last one)."""
        if self.loaded_tokens is None:
            return None
        return max(0, self.prompt_tokens - self.loaded_tokens)

    @property
    def loaded_blocks(self) -> int | None:
        if self.loaded_tokens is None or not self.block_size:
            return None
        return self.loaded_tokens // self.block_size

    @property
    def loaded_bytes(self) -> int | None:
        """Bytes of KV the decode server took instead of computing: the connector's count
        where it exports one, else the model's KV bytes a token times the tokens."""
        if self.transfer_bytes is not None:
            return self.transfer_bytes
        if self.loaded_tokens is None or not self.kv_bytes_per_token:
            return None
        return self.loaded_tokens * self.kv_bytes_per_token

    def parts(self) -> tuple[tuple[str, float], ...]:
        """The TTFT's terms, in order, adding up to it: the prefill server's answer (split
        into its queue, its prefill and the rest where it says), then the hand-off."""
        p, d = self.prefill_replica, self.decode_replica
        server = self.prefill_server
        out: list[tuple[str, float]] = []
        queue = server.queue_s if server is not None else None
        own = server.ttft_s if server is not None else None
        if queue is not None and own is not None and queue + own <= self.prefill_s:
            out += [(f"queue on {p}", queue), (f"prefill on {p}", own)]
            out.append((f"HTTP to and from {p}", self.prefill_s - queue - own))
        else:
            out.append((f"prefill on {p} (its whole answer)", self.prefill_s))
        if self.handoff_s is not None:
            moved = self.transfer_s
            if moved is not None and moved <= self.handoff_s:
                # The connector timed its own transfer (NIXL): the rest is the decode's step.
                out += [
                    (f"KV transfer to {d}", moved),
                    (f"first step on {d}", self.handoff_s - moved),
                ]
            else:
                out.append((f"KV hand-off + first step on {d}", self.handoff_s))
        return tuple(out)

    def words(self) -> str:
        """The KV's part in a reply's footer: what the decode server took, or that it
        found none and computed the prompt again."""
        p, d = self.prefill_replica, self.decode_replica
        if self.loaded_tokens is None:
            return f"KV from {p} to {d}: {self.loaded_source}"
        if self.fell_back:
            # What recomputing cost: the hand-off term then holds the decode server's
            # whole prefill, the one already paid on the prefill server.
            cost = (
                f", {self.handoff_s * 1000:,.0f} ms from {p}'s answer to its first token"
                if self.handoff_s is not None
                else ""
            )
            return (
                f"{d} found none of {p}'s KV: it fell back to computing all "
                f"{self.prompt_tokens:,} prompt tokens again{cost} ({self.loaded_source})"
            )
        blocks = self.loaded_blocks
        size = self.loaded_bytes
        what = [f"{blocks:,} blocks"] if blocks is not None else []
        if size is not None:
            what.append(f"{size / 1e6:,.1f} MB")
        extent = f" ({', '.join(what)})" if what else ""
        return (
            f"KV of {self.loaded_tokens:,} of {self.prompt_tokens:,} prompt tokens{extent} "
            f"from {p} to {d}, {self.recomputed_tokens:,} computed there "
            f"({self.loaded_source})"
        )

    @property
    def fell_back(self) -> bool:
        """The decode server found none of the prefill's KV (a prompt of a block or more):
        it computed the whole prompt again."""
        return (
            self.loaded_tokens == 0
            and self.block_size is not None
            and self.prompt_tokens > self.block_size
        )


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request_id: str
    reason: FinishReason
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    preemptions: int = 0
    # What the server itself measured, when the engine is a remote vLLM server that
    # sends per-request metrics (`--enable-per-request-metrics`); None otherwise.
    server: ServerTimings | None = None
    # What the in-process vLLM measured for the same request, from its own clocks.
    vllm: VllmTimings | None = None
    # Where the TTFT went, step by step (in-process engines only).
    anatomy: TtftAnatomy | None = None
    # Prompt tokens found in the engine's prefix cache, so not computed again (vLLM's
    # `num_cached_tokens`, a server's `cached_tokens`); None when the engine does not say.
    cached_prompt_tokens: int | None = None
    # Which replica of a fleet served it (engine/fleet/fleet_engine.py); None otherwise.
    fleet: ReplicaServed | None = None
    # Its prefill on one server and decode on another (engine/fleet/disaggregated.py).
    handoff: HandOff | None = None

    @classmethod
    def from_times(
        cls,
        request_id: str,
        reason: FinishReason,
        *,
        prompt_tokens: int,
        submitted_at: float,
        token_times: Sequence[float],
        now: float,
        preemptions: int = 0,
        vllm: VllmTimings | None = None,
        anatomy: TtftAnatomy | None = None,
    ) -> RequestFinished:
        """The one way every engine sums up a request: all times from `submitted_at`, the
        moment the caller asked, and one arrival time per output token."""
        return cls(
            request_id=request_id,
            reason=reason,
            prompt_tokens=prompt_tokens,
            output_tokens=len(token_times),
            ttft_s=(token_times[0] - submitted_at) if token_times else None,
            itl_s=tuple(b - a for a, b in itertools.pairwise(token_times)),
            e2e_s=(token_times[-1] if token_times else now) - submitted_at,
            preemptions=preemptions,
            vllm=vllm,
            anatomy=anatomy,
        )


@dataclass(frozen=True, slots=True)
class VllmTimings:
    """The in-process vLLM's own figures for one request, beside kvscope's.

    vLLM's TTFT runs from its own arrival time (when the step thread handed it the
    request); kvscope's from when the caller called `stream()`. The difference is time the
    request spent in kvscope's queue, waiting for a step in progress to end.
    """

    ttft_s: float | None
    itl_s: tuple[float, ...]  # from the engine core's timestamps, one per output token
    queue_s: float | None  # vLLM's: queued to first scheduled
    prefill_s: float | None  # vLLM's: first scheduled to first token
    kvscope_queue_s: float  # stream() called to vLLM's arrival time


@dataclass(frozen=True, slots=True)
class TtftAnatomy:
    """A request's TTFT split into parts that add up to it (to rounding).

    Every moment from `stream()` to the first token falls in exactly one part:
    - queue: before the scheduler first took the request (kvscope's queue included);
    - prefill: this request's own share of the steps that ran its prompt, split over
      `chunks` steps (the share is by tokens: a step that also ran 1,000 tokens of
      another request gives it most of that step);
    - others: the rest of those steps, plus steps between its chunks that ran without it;
    - preempted: after a preemption, until its recompute finished.
    """

    queue_s: float
    prefill_s: float
    chunks: int
    others_s: float
    preempted_s: float

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.others_s + self.preempted_s


EngineEvent = RequestAccepted | TokenEvent | RequestFinished


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """The physical KV blocks one live request holds after a step."""

    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int  # tokens whose KV is in those blocks


PAGE_BLOCKS = 256
"""Blocks per page of a BlockCacheState: a step that changes a few blocks rebuilds only
their pages, never a list as long as the pool (a GPU's holds 100,000 blocks)."""


@dataclass(frozen=True, slots=True)
class BlockCacheState:
    """The prefix cache's blocks as one step left them, from the engine's own pool.

    vLLM keeps a freed full block in its free queue with its hash, so a later prompt with
    the same prefix can take it back instead of computing it again; it is lost only when a
    new block is needed and it is the oldest such. So a free block is one of two kinds:
    empty, or cached (evictable: it counts as free, and still holds a prefix). A held
    block is reused when the request got it from the cache (a prefix hit).

    Both sets are split in pages of `PAGE_BLOCKS` IDs (page k holds IDs k*PAGE_BLOCKS up to
    the next page's, sorted); an unchanged page is the same tuple from step to step.
    """

    cached_pages: tuple[tuple[int, ...], ...] = ()
    reused_pages: tuple[tuple[int, ...], ...] = ()
    cached: int = 0  # free blocks holding a cached prefix
    reused: int = 0  # held blocks that a request got from the cache

    def cached_ids(self) -> tuple[int, ...]:
        return tuple(b for page in self.cached_pages for b in page)

    def reused_ids(self) -> tuple[int, ...]:
        return tuple(b for page in self.reused_pages for b in page)


@dataclass(frozen=True, slots=True)
class RequestWork:
    """One request's share of one step: prompt (or recompute) tokens, and decode tokens."""

    request_id: str
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True, slots=True)
class StepPerf:
    """The work of one step, or of one scrape window attached: FLOPs done and bytes read and
    written (weights, KV cache, activations), per GPU. `source` says who counted them:
    "vllm" (vLLM's own analytic model, `--enable-mfu-metrics`, read per step in-process),
    "vllm counters" (a server's `vllm:estimated_*_per_gpu_total` deltas over a scrape
    window) or "kvscope" (roofline/'s model of the same step)."""

    flops: float
    read_bytes: float
    write_bytes: float
    source: str

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved, the roofline's x; None when no byte moved."""
        moved = self.read_bytes + self.write_bytes
        return self.flops / moved if moved > 0 else None


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
    # What each scheduled request did in this step, and who waited (anatomy, timeline).
    work: tuple[RequestWork, ...] = ()
    waiting_ids: tuple[str, ...] = ()
    # True for the sample an engine emits when its last request ends or is aborted: no
    # step ran, but every panel must see the pool as it is now (empty), not as the last
    # step left it.
    idle: bool = False
    # Which free blocks still hold a cached prefix and which held ones were prefix hits;
    # None where the engine does not say (no prefix caching, a server, an older tape).
    block_cache: BlockCacheState | None = None
    # The step's FLOPs and bytes as vLLM counts them, and as kvscope's roofline model does
    # for the same scheduled tokens; None where not counted (see StepPerf).
    perf: StepPerf | None = None
    perf_model: StepPerf | None = None

    def blocks_for(self, tokens: int) -> int:
        """The blocks `tokens` tokens of KV fill at this step's block size, rounded up (in
        whole numbers, so a long prompt never loses a block to float rounding)."""
        return -(-tokens // max(self.block_size, 1))

    def short_of_kv(self, tokens: int) -> bool:
        """Whether a waiting request with a `tokens`-token prompt waits for KV blocks: fewer
        are free than its prompt fills. Otherwise it waits on the scheduler's token budget.
        The engine never says which; this is the one place kvscope decides it (the live
        request footer and the load bench's KV-bound share both ask here)."""
        return self.free_blocks < self.blocks_for(tokens)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One request's prompt tokens in a step that is still running: chunk `chunk` of about
    `chunks` (the rest counted at the step's token budget)."""

    request_id: str
    tokens: int
    chunk: int
    chunks: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class StepStarted:
    """A step the engine has scheduled and is running now, sent before the model runs.

    A long prefill is one step of many seconds; without this a view would show the last
    finished step (often "idle") for all of it. Its StepSample follows when it ends.
    """

    step: int
    started_at: float
    prefill_tokens: int
    decode_tokens: int
    chunks: tuple[PrefillChunk, ...]
    decoding: int  # requests making one output token each in this step
    blocks: tuple[RequestBlocks, ...]  # what the scheduled requests hold for this step
    free_blocks: int
    total_blocks: int
    block_cache: BlockCacheState | None = None  # as the scheduler just left it


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
class KvCacheGroup:
    """One of vLLM's KV cache groups: the layers of one attention type, sharing a block
    table per request; a hybrid model's groups all draw blocks from one pool."""

    kind: str  # "full attention", "sliding window 4096", "mamba"
    block_size: int
    num_layers: int
    drawn: bool = False  # the group whose block IDs StepSample.blocks hold


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
    # Names of the fields above this engine could not know (a remote server does not
    # tell its layer count, head geometry or dtype): those read 0 or "unknown".
    unknown: tuple[str, ...] = ()
    # How the engine is spread over devices, e.g. "TP 2 x PP 1 x DP 1 (mp)"; "" for one.
    parallel: str = ""
    # How its steps relate to its batches, e.g. "async scheduling on: 2 batches in flight";
    # "" where the engine does not say (a fake, a server, an older tape).
    scheduling: str = ""
    # vLLM's KV cache groups, in its order; () where the engine does not say.
    kv_groups: tuple[KvCacheGroup, ...] = ()
    # vLLM's own token capacity where the pool serves several groups (each request holds
    # blocks in every group, so blocks x block size overstates it); 0: blocks x block size.
    kv_capacity_tokens: int = 0
    exact_steps: bool | None = None
    """Whether the engine's StepSamples are its real scheduler steps, each with every
    request's prefill and decode tokens and block IDs (True: vLLM in this process, the
    fake), or windows between two scrapes of a server's /metrics (False: an attached
    server, a fleet). It is on the card so that a tape, which keeps the card and not the
    engine, says it too. None: the card does not say, as on tapes recorded before this
    field; `Tape.exact_steps` (engine/tape/reader.py) answers for those."""

    @property
    def kv_pool_tokens(self) -> int:
        return self.kv_capacity_tokens or self.total_blocks * self.block_size

    @property
    def nearest_known_limit(self) -> int | None:
        """The smaller of max_model_len and the KV pool, of those this engine knows (a
        server that is not vLLM's may say neither: 0); None when it knows neither."""
        known = [n for n in (self.max_model_len, self.kv_pool_tokens) if n > 0]
        return min(known) if known else None

    def blocks_for(self, num_tokens: int) -> int:
        # A remote card may not know its block size (no /metrics): count tokens then.
        return math.ceil(num_tokens / max(self.block_size, 1))


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """A stage of engine start-up, with its share of the whole (0..1)."""

    stage: str
    fraction: float


ProgressCallback = Callable[[LoadProgress], None]
StepListener = Callable[[StepSample], None]
StepStartListener = Callable[[StepStarted], None]


# -- a remote vLLM server (engine/remote/) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """What a vLLM server measured for one request (its per-request `metrics` object).

    The server's TTFT runs from when the request was scheduled to its first token, so it
    leaves out queueing and the network; the client's own TTFT (RequestFinished.ttft_s)
    includes both.
    """

    ttft_s: float | None
    mean_itl_s: float | None
    queue_s: float | None
    generation_s: float | None  # first output token to last
    tokens_per_s: float | None
    cached_prompt_tokens: int | None = None  # prefix-cache hit, when the server says


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """A server histogram's counts since the client attached (Prometheus buckets)."""

    name: str
    buckets: tuple[tuple[float, int], ...]  # (upper bound `le`, cumulative count)
    count: int
    total: float  # sum of the observed values

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket that holds rank q."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                inside = cumulative - below
                if inside <= 0:
                    return le
                return lower + (le - lower) * (rank - below) / inside
            lower, below = le, cumulative
        return lower


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine (data-parallel rank, the `engine` label) in one /metrics scrape."""

    engine: str
    running: int
    waiting: int
    waiting_by_reason: tuple[tuple[str, int], ...]
    kv_usage: float  # 0..1
    used_blocks: int  # kv_usage × total_blocks, rounded
    total_blocks: int
    preemptions: int  # since attach
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    prefix_cache_hit_rate: float | None  # since attach; None before any lookup


@dataclass(frozen=True, slots=True)
class ScrapeSample:
    """A remote server's state from one /metrics scrape: the remote StepSample.

    A remote engine has no visible steps. Token counts are counter deltas between two
    scrapes, not one step's prefill/decode split.
    """

    seq: int
    time_s: float  # when the scrape arrived, on the client's perf_counter clock
    interval_s: float  # since the previous scrape
    rows: tuple[EngineRow, ...]  # one per `engine` label
    running: int
    waiting: int
    waiting_by_reason: tuple[tuple[str, int], ...]
    kv_usage: float
    used_blocks: int
    total_blocks: int
    block_size: int
    preemptions: int  # since attach
    new_preemptions: int  # since the previous scrape
    prompt_tokens: int  # since the previous scrape
    generation_tokens: int  # since the previous scrape
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    prefix_cache_hit_rate: float | None  # since attach
    ttft: HistogramDelta
    itl: HistogramDelta
    queue_time: HistogramDelta
    e2e: HistogramDelta
    server_restarted: bool = False  # counters went back: deltas now run from the restart
    # The server's own estimate of the window's FLOPs and bytes per GPU (its
    # `vllm:estimated_*_per_gpu_total` deltas, source "vllm counters"); None without
    # `--enable-mfu-metrics`, or on the first scrape.
    perf: StepPerf | None = None


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """One full KV block in a remote server's prefix cache, known from its KV events.

    Addressed by vLLM's block hash: the server never sends a physical block ID.
    """

    block_hash: int | bytes
    parent_hash: int | bytes | None
    num_tokens: int
    session_id: str | None  # the session whose request stored it first
    touched_by: tuple[str, ...]  # every session that stored or re-used it, in order
    rank: int  # data-parallel rank
    stored_at: float  # perf_counter when the event arrived


@dataclass(frozen=True, slots=True)
class PrefixCacheView:
    """The prefix-cache index rebuilt from KV events, at one moment."""

    blocks: tuple[CachedBlock, ...]  # in the order they were stored
    stored_total: int  # BlockStored blocks since attach
    reused_total: int  # blocks stored again by a later request (a prefix-cache hit)
    removed_total: int  # BlockRemoved blocks since attach (a lower bound on evictions)
    cleared: int  # AllBlocksCleared events
    batches: int  # event batches applied
    replayed: int  # batches recovered through the replay socket
    missed: int  # batches lost to a gap that replay could not fill
    receiving: bool  # at least one batch arrived
    note: str  # one sentence: what the index shows, or how to turn events on

    def by_session(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for b in self.blocks:
            counts[b.session_id] = counts.get(b.session_id, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class RemoteCapabilities:
    """What a remote engine can show right now; panels read it to say what they cannot.

    What no remote engine can show (exact steps, block IDs) is in its EngineFeatures."""

    url: str
    reachable: bool
    metrics: bool
    metrics_note: str  # "" when metrics flow, else why not, in one sentence
    kv_events: bool
    kv_events_note: str
    server_timings: bool | None  # per-request metrics seen; None before any request ended
    notes: tuple[str, ...] = ()  # the limits of a remote view, one sentence each


ScrapeListener = Callable[[ScrapeSample], None]


# -- session tapes (engine/tape/) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserMessage:
    """What the user sent, as the chat shows it. The engine never sees it; a tape keeps it
    so that a replay and `--resume` can show the transcript as it was."""

    text: str
    time_s: float  # when it was sent, on the engine's clock
    request_ids: tuple[str, ...] = ()  # the requests it started, one per copy
    synthetic_tokens: int | None = None  # the prompt-length slider's N, when it was on
