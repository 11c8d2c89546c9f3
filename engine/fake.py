"""A scripted, deterministic engine with the same protocol as VllmEngine.

It exists for the UI's pilot tests and snapshots and for the UI benchmark. It imports no
vLLM, runs on an injected clock, and schedules like a tiny paged-attention engine: whole-
prompt prefill (or chunks of `max_num_batched_tokens`), one token per decode step, blocks
taken from a free list, and preemption of the newest request when a decode step finds no
free block; with `prefix_caching`, freed full blocks stay cached as vLLM keeps them. Its
step samples say what each request did, and each finished request carries
its TTFT anatomy, as VllmEngine's do. The engine contract tests run it beside the real
engines (tests/test_engine_protocol.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.block_cache import BlockCacheTracker
from engine.clock import Clock, VirtualClock
from engine.errors import EngineDied
from engine.events import (
    BlockCacheState,
    ChatMessage,
    EngineEvent,
    FinishReason,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    ProgressCallback,
    RequestBlocks,
    RequestWork,
    StepListener,
    StepPerf,
    StepSample,
)
from engine.features import IN_PROCESS, EngineFeatures
from engine.listeners import StepListeners
from engine.request_book import (
    LiveRequest,
    RequestBook,
    RequestTimes,
    check_prompt_length,
    idle_sample,
)
from engine.sizes import kv_bytes_per_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

REPLY = [
    "The",
    "KV",
    "cache",
    "keeps",
    "the",
    "keys",
    "and",
    "values",
    "of",
    "every",
    "token",
    "seen",
    "so",
    "far",
    ",",
    "so",
    "each",
    "new",
    "token",
    "reads",
    "them",
    "instead",
    "of",
    "recomputing",
    "the",
    "whole",
    "prompt",
    ".",
    "Prefill",
    "fills",
    "the",
    "cache",
    "in",
    "one",
    "large",
    "step",
    ";",
    "decode",
    "then",
    "adds",
    "one",
    "token",
    "per",
    "step",
    ",",
    "and",
    "each",
    "step",
    "reads",
    "the",
    "weights",
    "once",
    ".",
]

FILLER = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]

FAKE_PEAK_FLOPS = 4e12
"""The fake's machine, FLOP/s: above what its default timings reach (2 x params per prompt
token every `prefill_s_per_token`, 2.7 TFLOP/s for a long prompt), so its prefill steps land
under the flat roof, as a real machine's do."""
FAKE_MEM_BANDWIDTH = 32e9
"""The fake's machine, bytes/s: above the most its default steps move (the weights in one
`prefill_base_s`, 27 GB/s; a context token's KV every `decode_s_per_context_token`, 23 GB/s),
so its decode steps land under the sloped roof."""
PERF_SOURCE = "fake"
"""Who counted the fake's StepPerf: itself, from the analytic model in `FakeEngine._perf`."""

# Chat template overhead, in tokens: the fake's stand-in for "<|im_start|>user\n ... <|im_end|>".
PER_MESSAGE_OVERHEAD = 4
GENERATION_PROMPT = 3


@dataclass(frozen=True)
class FakeConfig:
    name: str = "fake/SmolLM2-135M-Instruct"
    max_model_len: int = 2048
    block_size: int = 16
    total_blocks: int = 64
    num_layers: int = 30
    num_kv_heads: int = 3
    head_dim: int = 64
    prefill_s_per_token: float = 0.0001
    prefill_base_s: float = 0.01
    decode_step_s: float = 0.02
    decode_s_per_context_token: float = 0.000001
    reply_words: tuple[str, ...] = tuple(REPLY)
    # Scripted stalls: output index -> extra seconds, to show the latency colouring.
    stalls: tuple[tuple[int, float], ...] = ()
    die_at_step: int | None = None
    # vLLM's per-step token budget: with it, prompts are prefilled in chunks of at most
    # this many tokens, after the decodes, as vLLM's chunked prefill does. None: whole
    # prompts in one step (the fake's behaviour before it had a budget).
    max_num_batched_tokens: int | None = None
    # vLLM's automatic prefix caching: a freed full block keeps its content (hashed by
    # the tokens up to its end) at the back of the free list, evicted last; a new prompt
    # starting with the same full blocks takes them back instead of prefilling them. Off
    # by default, so scripts written before it keep their exact steps and blocks.
    prefix_caching: bool = False
    # The weights the fake's step counts are made of (SmolLM2-135M's parameters, in bf16):
    # FLOPs and bytes of each step are set from these (FakeEngine._perf), not measured.
    params: int = 134_515_008
    bytes_per_param: int = 2


@dataclass(eq=False)  # live state, compared by identity (`in` a queue is O(1) per item)
class _Live(LiveRequest):
    internal_id: str = ""
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in `blocks`
    prefill_left: int = 0  # prompt tokens still to prefill (chunked prefill)
    aborted: bool = False
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, first time in
    hashed: int = 0  # leading blocks whose content is in the prefix cache's index
    last_key: int | None = None  # the hash of the last of them (each chains on the one before)

    @property
    def output_tokens(self) -> int:
        return self.times.tokens


class FakeEngine:
    def __init__(self, config: FakeConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or FakeConfig()
        self.clock: Clock = clock or VirtualClock()
        self._card: ModelCard | None = None
        self._listeners = StepListeners()
        self._waiting: list[_Live] = []
        self._running: list[_Live] = []
        self._book: RequestBook[_Live] = RequestBook()
        self._free: list[int] = []
        # Prefix caching (FakeConfig.prefix_caching): freed blocks still holding a prefix,
        # oldest first (taken only when no empty block is left, evicting their content);
        # the index from a block's content hash to the block; who holds each block.
        self._evictable: dict[int, None] = {}
        self._cache: dict[int, int] = {}
        self._key_of: dict[int, int] = {}
        self._refs: dict[int, int] = {}
        self._tracker: BlockCacheTracker | None = None
        self._step = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._dead: str | None = None
        self._ids = itertools.count()

    # -- protocol -------------------------------------------------------------------------
    @property
    def card(self) -> ModelCard | None:
        return self._card

    @property
    def features(self) -> EngineFeatures:
        # The fake schedules its own steps, so it knows everything vLLM's scheduler would.
        return dataclasses.replace(IN_PROCESS, clock=self.clock)

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        c = self.config
        for i, stage in enumerate(("reading config", "loading weights", "allocating KV pool")):
            if progress:
                progress(LoadProgress(stage, (i + 1) / 3))
        self._free = list(range(c.total_blocks))
        self._evictable, self._cache, self._key_of, self._refs = {}, {}, {}, {}
        self._tracker = BlockCacheTracker(c.total_blocks) if c.prefix_caching else None
        self._dead = None
        self._step = 0
        self._card = ModelCard(
            name=c.name,
            path=c.name,
            dtype="bfloat16",
            num_layers=c.num_layers,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            kv_bytes_per_token=kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, 2),
            max_model_len=c.max_model_len,
            block_size=c.block_size,
            total_blocks=c.total_blocks,
            device="fake",
            exact_steps=self.features.exact_steps,  # for a tape, which keeps the card
        )
        return self._card

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        ids: list[int] = []
        for m in messages:
            # An assistant turn starts with the generation prompt its request ended with,
            # as real chat templates do: the next turn's prompt then starts with the whole
            # previous one, and prefix caching finds it.
            head = [2] * GENERATION_PROMPT if m.role == "assistant" else []
            ids += head + [1] * (PER_MESSAGE_OVERHEAD - len(head))
            ids += [self._word_id(w) for w in m.content.split()]
        return tuple(ids + [2] * GENERATION_PROMPT)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        tail = [self._word_id(w) for w in suffix.split()]
        fixed = PER_MESSAGE_OVERHEAD + GENERATION_PROMPT + len(tail)
        filler = [100 + (seed + i) % len(FILLER) for i in range(max(0, num_tokens - fixed))]
        ids = [1] * PER_MESSAGE_OVERHEAD + filler + tail + [2] * GENERATION_PROMPT
        return tuple(ids[:num_tokens]) if len(ids) > num_tokens else tuple(ids)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if self._card is None:
            raise EngineDied("the engine was never started")
        if self._dead:
            raise EngineDied(self._dead)
        ids = request.prompt_token_ids or self.chat_prompt_ids(request.messages)
        check_prompt_length(len(ids), self.config.max_model_len)
        rid = request.request_id
        live = _Live(request, RequestTimes.stepped(rid, self.clock.now()), tuple(ids))

        def submit() -> _Live:
            live.internal_id = f"{rid}-{next(self._ids):04d}"
            self._book.add(live)
            self._waiting.append(live)
            self._ensure_loop()
            live.put(live.accepted())
            return live

        async for event in self._book.stream(rid, submit, self.abort):
            yield event

    def abort(self, request_id: str) -> None:
        live = self._book.get(request_id)
        if live is not None:
            live.aborted = True
            if self._wake:
                self._wake.set()

    def shutdown(self) -> None:
        if self._task and not self._task.done():
            self._task.cancel()
        self._task = None

    # -- the scheduler ---------------------------------------------------------------------
    def _word_id(self, word: str) -> int:
        return 1000 + sum(map(ord, word)) % 30000

    def _text(self, index: int) -> str:
        words = self.config.reply_words
        w = words[index % len(words)]
        return w if index == 0 else " " + w

    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        assert self._wake is not None
        self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._do_step()
            await self.clock.sleep(self._last_duration)

    @property
    def _num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    def _alloc(self, live: _Live, num_tokens: int) -> bool:
        need = math.ceil(num_tokens / self.config.block_size) - len(live.blocks)
        if need > self._num_free:
            return False
        for _ in range(max(0, need)):
            live.blocks.append(self._take_free())
        return True

    def _take_free(self) -> int:
        if self._tracker is None:
            return self._free.pop(0)
        if self._free:
            block = self._free.pop(0)
        else:
            # No empty block left: the oldest cached one loses its content.
            block = next(iter(self._evictable))
            del self._evictable[block]
            key = self._key_of.pop(block, None)
            if key is not None and self._cache.get(key) == block:
                del self._cache[key]
        self._refs[block] = 1
        self._tracker.taken((block,), reused=False)
        return block

    def _release(self, live: _Live) -> None:
        if self._tracker is None:
            self._free.extend(live.blocks)
            self._free.sort()
        else:
            # Tail first, as vLLM frees: a request's last blocks are evicted before its
            # first ones, which a follow-up prompt is likeliest to share.
            for block in reversed(live.blocks):
                self._refs[block] -= 1
                if self._refs[block]:
                    continue  # another request shares it
                del self._refs[block]
                cached = block in self._key_of
                if cached:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
                self._tracker.freed((block,) if cached else (), () if cached else (block,))
            self._free.sort()
        live.blocks.clear()
        live.computed = 0
        live.hashed, live.last_key = 0, None

    def _chain(self, live: _Live, block: int, key: int | None) -> int:
        """The content hash of a request's `block`-th block: its tokens and all before."""
        size = self.config.block_size
        start, end = block * size, (block + 1) * size
        prompt = live.prompt_ids
        # The outputs' IDs are the fake's own (1000 + index), as its TokenEvents say.
        outputs = tuple(
            1000 + i for i in range(max(start, len(prompt)) - len(prompt), end - len(prompt))
        )
        return hash((key, prompt[start:end] + outputs))

    def _prefix_hit(self, live: _Live) -> list[int]:
        """The cached blocks a new prompt starts with (never its last token: vLLM always
        computes at least one, to have logits for the first output token)."""
        hits: list[int] = []
        key: int | None = None
        for k in range((len(live.prompt_ids) + live.output_tokens - 1) // self.config.block_size):
            key = self._chain(live, k, key)
            block = self._cache.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _index_full_blocks(self, live: _Live) -> None:
        """Put the request's newly full blocks in the prefix cache's index."""
        size = self.config.block_size
        while live.hashed < min(len(live.blocks), live.computed // size):
            key = self._chain(live, live.hashed, live.last_key)
            block = live.blocks[live.hashed]
            self._cache.setdefault(key, block)  # the first block with it serves the hits
            self._key_of[block] = key
            live.hashed, live.last_key = live.hashed + 1, key

    def _admit(self, live: _Live, num_tokens: int) -> bool:
        """Blocks for a waiting request's whole prompt: its cached prefix first."""
        if self._tracker is None:
            return self._alloc(live, num_tokens)
        hits = self._prefix_hit(live)
        free_hits = sum(1 for b in hits if b in self._evictable)
        need = math.ceil(num_tokens / self.config.block_size) - len(hits)
        if need > self._num_free - free_hits:
            return False
        for block in hits:
            self._evictable.pop(block, None)
            self._refs[block] = self._refs.get(block, 0) + 1
            self._tracker.taken((block,), reused=True)
        live.blocks.extend(hits)
        live.hashed = len(hits)
        live.last_key = self._key_of.get(hits[-1]) if hits else None
        live.computed = len(hits) * self.config.block_size
        if live.cached_tokens is None:
            live.cached_tokens = live.computed  # vLLM counts a request's first prefill only
        return self._alloc(live, num_tokens)

    def _block_cache(self) -> BlockCacheState | None:
        return self._tracker.state() if self._tracker is not None else None

    def _finish(self, live: _Live, reason: FinishReason) -> None:
        self._release(live)
        done = self._book.finish(live, reason, self.clock.now())
        if live.cached_tokens is not None:
            done = dataclasses.replace(done, cached_prompt_tokens=live.cached_tokens)
        live.put(done)

    def _do_step(self) -> None:
        c = self.config
        self._step += 1
        started = self.clock.now()
        if c.die_at_step is not None and self._step >= c.die_at_step:
            self._dead = f"scripted failure at step {self._step}"
            for live in self._book.end_all():
                live.put(EngineDied(self._dead))
            self._waiting.clear()
            self._running.clear()
            self._last_duration = 0.0
            return
        for live in [x for x in self._waiting + self._running if x.aborted]:
            (self._waiting if live in self._waiting else self._running).remove(live)
            self._finish(live, "abort")
        if not self._waiting and not self._running:
            self._step -= 1  # nothing ran
            self._last_duration = 0.0
            self._emit_idle()
            return

        prefill = decode = 0
        budget = c.max_num_batched_tokens if c.max_num_batched_tokens is not None else math.inf
        preempted: list[str] = []
        # Each scheduled request's share of this step, in the order it was scheduled.
        work: dict[str, RequestWork] = {}
        # Decode first, as vLLM does: running requests keep their place.
        for live in list(self._running):
            if live not in self._running or live.prefill_left > 0:
                continue
            while not self._alloc(live, live.computed + 1):
                victim = self._running[-1]
                self._running.remove(victim)
                self._release(victim)
                victim.preemptions += 1
                victim.times.lose_output(started)
                work.pop(victim.request.request_id, None)
                preempted.append(victim.request.request_id)
                self._waiting.insert(0, victim)
                if victim is live:
                    break
            if live in self._running:
                live.computed += 1
                decode += 1
                budget -= 1
                rid = live.request.request_id
                work[rid] = RequestWork(rid, 0, 1)
        # Then the next chunk of prompts already being prefilled (chunked prefill only).
        for live in self._running:
            chunk = int(min(live.prefill_left, budget))
            if chunk > 0:
                live.computed += chunk
                live.prefill_left -= chunk
                prefill += chunk
                budget -= chunk
                rid = live.request.request_id
                work[rid] = RequestWork(rid, chunk, 0)
        # Then admit waiting requests whose whole prompt fits.
        for live in list(self._waiting):
            if budget <= 0:
                break
            n = len(live.prompt_ids) + live.output_tokens
            if not self._admit(live, n):
                break
            self._waiting.remove(live)
            self._running.append(live)
            cached = live.computed  # 0 without prefix caching
            chunk = int(min(n - cached, budget))
            live.computed = cached + chunk
            live.prefill_left = n - cached - chunk
            prefill += chunk
            budget -= chunk
            rid = live.request.request_id
            work[rid] = RequestWork(rid, chunk, 0)
        if self._tracker is not None:
            for live in self._running:
                self._index_full_blocks(live)
        context = sum(x.computed for x in self._running)
        # The KV each scheduled request read: what it held before this step's tokens.
        held = {x.request.request_id: x.computed for x in self._running}
        read_kv = sum(
            held.get(w.request_id, 0) - w.prefill_tokens - w.decode_tokens for w in work.values()
        )
        duration = (c.prefill_base_s + c.prefill_s_per_token * prefill if prefill else 0.0) + (
            c.decode_step_s + c.decode_s_per_context_token * context if decode else 0.0
        )
        end = started + duration
        own_prefill = {rid: w.prefill_tokens for rid, w in work.items()}
        self._book.book_step(started, end, own_prefill, prefill + decode, set(preempted))
        for live in list(self._running):
            if live.prefill_left > 0:
                continue  # no token before its whole prompt is in
            index = live.output_tokens
            t = end + dict(c.stalls).get(index, 0.0)
            live.put(live.times.token((1000 + index,), self._text(index), step=self._step, at=t))
        sample = StepSample(
            step=self._step,
            started_at=started,
            duration_s=duration,
            prefill_tokens=prefill,
            decode_tokens=decode,
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=1 - self._num_free / c.total_blocks,
            free_blocks=self._num_free,
            total_blocks=c.total_blocks,
            block_size=c.block_size,
            blocks=tuple(
                RequestBlocks(x.request.request_id, tuple(x.blocks), x.computed)
                for x in self._running
            ),
            preemptions=len(preempted),
            preempted_ids=tuple(preempted),
            work=tuple(work.values()),
            waiting_ids=tuple(x.request.request_id for x in self._waiting),
            block_cache=self._block_cache(),
            perf=self._perf(prefill + decode, read_kv),
        )
        self._last_duration = duration
        self._listeners.emit(sample)
        for live in list(self._running):
            sp = live.request.sampling
            if live.output_tokens >= sp.max_tokens:
                self._running.remove(live)
                self._finish(live, "length")
            elif not sp.ignore_eos and live.output_tokens >= len(c.reply_words):
                self._running.remove(live)
                self._finish(live, "stop")
        if not self._waiting and not self._running:
            self._emit_idle()

    def _perf(self, tokens: int, read_kv_tokens: int) -> StepPerf:
        """The fake's set counts for a step of `tokens` tokens that read `read_kv_tokens`
        tokens of KV: a simple analytic model standing in for vLLM's own count
        (`--enable-mfu-metrics`), derived from the config, never measured. 2 FLOPs per
        parameter per token (the matmuls; attention left out); the weights read once per
        step whatever the batch (which is why a bigger batch moves decode right); each
        token's KV written once and the context's KV read once."""
        c = self.config
        kv = kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, 2)
        return StepPerf(
            flops=2.0 * c.params * tokens,
            read_bytes=float(c.params * c.bytes_per_param + kv * max(0, read_kv_tokens)),
            write_bytes=float(kv * tokens),
            source=PERF_SOURCE,
        )

    def _emit_idle(self) -> None:
        if not self._book.went_idle():
            return
        c = self.config
        sample = idle_sample(
            step=self._step,
            at=self.clock.now(),
            kv_usage=1 - self._num_free / c.total_blocks,
            free_blocks=self._num_free,
            total_blocks=c.total_blocks,
            block_size=c.block_size,
        )
        self._listeners.emit(dataclasses.replace(sample, block_cache=self._block_cache()))

    _last_duration: float = 0.0
