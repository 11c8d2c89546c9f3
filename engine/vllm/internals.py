"""The one module that reaches into vLLM's unversioned internals.

Scheduler, KV-cache manager and block pool are not public API. Everything kvscope needs
from them is read here, so a vLLM upgrade that moves them breaks this file alone, and
tests/test_vllm_engine.py::test_vllm_internals_are_where_kvscope_expects says so.

Block IDs: vLLM's pool reserves physical block 0 as a "null block" that no request ever
holds. kvscope reports the usable pool as blocks 0..N-1, i.e. vLLM's ID minus one, so a
block map can draw exactly `total_blocks` cells.

KV cache groups: a hybrid model (sliding window + full attention, Mamba or linear attention
+ full attention) has several groups, one manager and one block table per request each, all
drawing from one pool. See `GroupReader` for how a group's lists are read and
`EngineIntrospector.drawn` for the group whose IDs the block map gets.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine.block_cache import BlockCacheTracker
from engine.events import (
    BlockCacheState,
    KvCacheGroup,
    PrefillChunk,
    RequestBlocks,
    StepPerf,
    StepStarted,
)
from engine.memory_budget import MemoryBudget

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    prefill_tokens: int
    decode_tokens: int
    preempted_internal_ids: tuple[str, ...]
    # Per scheduled request (vLLM's internal ID): (prefill tokens, decode tokens).
    per_request: dict[str, tuple[int, int]] = field(default_factory=dict)
    waiting_internal_ids: tuple[str, ...] = ()
    scheduled_at: float = 0.0  # perf_counter when the scheduler made this batch
    number: int = 0
    """The step number of a batch with work (1, 2, ... in the order vLLM scheduled them);
    0 for a batch with none, which is never a step."""
    perf: StepPerf | None = None
    """vLLM's own count of this batch's FLOPs and bytes (`--enable-mfu-metrics`), set
    when its tokens come back (see `vllm_step_perf`); None when vLLM did not count it."""


VLLM_PERF_SOURCE = "vllm"
"""`StepPerf.source` of vLLM's own per-step count, read in this process."""


def vllm_step_perf(outputs: Any) -> StepPerf | None:
    """vLLM's count of the batch `Scheduler.update_from_output` just took in, from the
    `SchedulerStats` it returned (on one client's outputs only); None when it counted
    nothing (`--no-enable-mfu-metrics`, `--disable-log-stats`, a model its analytic model
    does not know)."""
    for eco in outputs.values():
        stats = eco.scheduler_stats
        counted = stats.perf_stats if stats is not None else None
        if counted is not None:
            return StepPerf(
                flops=float(counted.num_flops_per_gpu),
                read_bytes=float(counted.num_read_bytes_per_gpu),
                write_bytes=float(counted.num_write_bytes_per_gpu),
                source=VLLM_PERF_SOURCE,
            )
    return None


def summed_perf(counts: list[StepPerf | None]) -> StepPerf | None:
    """Several batches' counts as one step's: None unless vLLM counted every one."""
    if not counts or any(c is None for c in counts):
        return None
    known = [c for c in counts if c is not None]
    return StepPerf(
        flops=sum(c.flops for c in known),
        read_bytes=sum(c.read_bytes for c in known),
        write_bytes=sum(c.write_bytes for c in known),
        source=known[0].source,
    )


def configured_here(logging_config: Any) -> None:
    """Tell vLLM that this process already logs as `logging_config` says, so that engine
    start-up (`configure_logging_if_needed`) does not apply it here again; the worker
    processes it is handed to still apply it."""
    import vllm.logger

    vllm.logger._last_configured_logging_config = logging_config


def decoding(prompt_tokens: int, computed_before: int, outputs_before: int) -> bool:
    """Whether a scheduled request is making its next output token, not (re)computing its
    prompt, from the counts the scheduler output itself carries for it: tokens computed
    and output tokens made (with async scheduling, placeholders for tokens still in flight
    included) before this batch. A decode has every token but the newest computed; a
    preempted request recomputing its prompt and earlier output has not.

    Request state read after `schedule()` returns will not do: `AsyncScheduler` has by
    then added this very batch's placeholder, and every decode would read as a 1-token
    prefill (its `_update_after_schedule`)."""
    return outputs_before > 0 and computed_before >= prompt_tokens + outputs_before - 1


class EngineIntrospector:
    """Read-only view of an in-process vLLM V1 `LLMEngine`'s scheduler state."""

    def __init__(self, llm_engine: Any) -> None:
        core_client = llm_engine.engine_core
        core = getattr(core_client, "engine_core", None)
        if core is None:
            raise RuntimeError(
                "vLLM's engine core is not in this process; kvscope needs "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        self.core = core
        self.scheduler = core.scheduler
        self.kv_manager = self.scheduler.kv_cache_manager
        self.block_pool = self.kv_manager.block_pool
        self.vllm_config = llm_engine.vllm_config
        self.output_processor = llm_engine.output_processor
        self._begin(self.kv_manager, group_readers(self.kv_manager))
        self._wrap_schedule()
        self.cache_tracker: BlockCacheTracker | None = None
        """The prefix cache's blocks (None with prefix caching off), see `_wrap_pool`."""
        if bool(self.block_pool.enable_caching):
            self.cache_tracker = BlockCacheTracker(self.total_blocks)
            self._wrap_pool(self.block_pool, self.cache_tracker)

    def _begin(self, kv_manager: Any, groups: tuple[GroupReader, ...]) -> None:
        """The state the steps keep. `groups` empty: ask vLLM for each request's IDs."""
        self.kv_manager = kv_manager
        self.groups = groups
        self.drawn = drawn_group(groups)
        """The group whose block IDs `live_blocks` reports, see `drawn_group`."""
        # Batches scheduled and not yet handed out, by the scheduler output's identity (the
        # output object is kept with its summary, so the identity stays unique), and the
        # summaries of the batches whose outputs came back since the last step was read.
        self._in_flight: dict[int, tuple[object, ScheduledWork]] = {}
        self._handed_out: list[ScheduledWork] = []
        self._numbered = 0  # batches with work scheduled so far (see ScheduledWork.number)
        self.blocks_ahead = 0
        """Blocks the last `live_blocks` left out: held for a batch still in flight."""
        # A full re-read now and then, in case a manager that `group_readers` takes for
        # one that only appends or nulls a head changes the middle of a list.
        self._rebuild_every = 64
        self._since_rebuild = 0
        self.on_scheduled: Callable[[ScheduledWork], None] | None = None
        """Called on the step thread with each batch as the scheduler makes it, before the
        model runs it (in lockstep, inside the `step()` that then runs it)."""
        self._chunks_done: dict[str, int] = {}  # prefill chunks each request has had

    def _wrap_schedule(self) -> None:
        # The scheduler output says what a batch does (prefill vs decode, preemptions);
        # LLMEngine.step() does not return it, so keep a copy as it passes. With async
        # scheduling or pipeline parallelism (CUDA's default) the engine core keeps a queue
        # of batches: step k schedules batch k and hands out batch k-1's tokens, so each
        # summary waits, keyed by its scheduler output, until `update_from_output` takes
        # that batch's tokens in. A step then describes the batch whose tokens it hands out.
        schedule = self.scheduler.schedule
        update = self.scheduler.update_from_output

        def scheduled(*args: Any, **kwargs: Any) -> Any:
            at = time.perf_counter()
            out = schedule(*args, **kwargs)
            try:
                work = self._summarize(out, at)
                if work.prefill_tokens + work.decode_tokens:
                    # Numbered as it is made, so that its start and its sample carry one
                    # number however many batches are in flight, and an empty batch (most
                    # of them under pipeline parallelism) takes none.
                    self._numbered += 1
                    work = replace(work, number=self._numbered)
                self._in_flight[id(out)] = (out, work)
                if self.on_scheduled is not None:
                    self.on_scheduled(work)
            except Exception:  # never let bookkeeping break the engine
                self._in_flight.pop(id(out), None)
            return out

        def updated(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            entry = self._in_flight.pop(id(scheduler_output), None)
            result = update(scheduler_output, *args, **kwargs)
            if entry is not None:
                work = entry[1]
                # vLLM counts a batch's FLOPs and bytes inside this very call, from this
                # very `scheduler_output` (`Scheduler.update_from_output` calls
                # `ModelMetrics.get_step_perf_stats_per_gpu(scheduler_output)` and returns
                # the count in this call's `SchedulerStats`), and the summary was keyed by
                # the same object when it was scheduled: so the count is this batch's, with
                # any number of batches in flight, never its neighbour's.
                with contextlib.suppress(Exception):  # bookkeeping never breaks the engine
                    work = replace(work, perf=vllm_step_perf(result))
                self._handed_out.append(work)
            return result

        self.scheduler.schedule = scheduled
        self.scheduler.update_from_output = updated

    @staticmethod
    def _wrap_pool(pool: Any, tracker: BlockCacheTracker) -> None:
        # The pool's free queue keeps a freed full block with its hash (cached, evictable)
        # until a new block evicts it; a prefix hit takes it back with `touch`. No field
        # says which free blocks still hold a prefix short of walking the whole queue, so
        # each change is told to the tracker as the pool makes it: a cost per block that
        # changes hands, not per block in the pool. IDs are vLLM's minus one (the null block).
        free_blocks, get_new_blocks, touch = pool.free_blocks, pool.get_new_blocks, pool.touch
        evict_blocks, reset, unpin = pool.evict_blocks, pool.reset_prefix_cache, pool.unpin_blocks

        # The bookkeeping runs after vLLM's own call and never lets an error reach vLLM.
        def released(blocks: list[Any]) -> None:
            with contextlib.suppress(Exception):
                free = [b for b in blocks if b.ref_cnt == 0 and not b.is_null and b.pool is pool]
                tracker.freed(
                    [b.block_id - 1 for b in free if b.block_hash is not None],
                    [b.block_id - 1 for b in free if b.block_hash is None],
                )

        def freeing(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)  # often `reversed(...)`: it can be read once only
            free_blocks(blocks)
            released(blocks)

        def unpinning(blocks: Any, on_reuse: Any) -> None:
            blocks = list(blocks)
            unpin(blocks, on_reuse)
            released(blocks)

        def taken(blocks: Any, reused: bool) -> None:
            with contextlib.suppress(Exception):
                tracker.taken([b.block_id - 1 for b in blocks if not b.is_null], reused=reused)

        def getting(num_blocks: int) -> Any:
            got = get_new_blocks(num_blocks)
            taken(got, False)
            return got

        def touching(blocks: Any) -> None:
            touch(blocks)
            taken(blocks, True)

        def evicting(block_ids: set[int]) -> None:
            evict_blocks(block_ids)
            with contextlib.suppress(Exception):
                tracker.evicted(i - 1 for i in block_ids if pool.blocks[i].block_hash is None)

        def resetting() -> bool:
            ok = bool(reset())
            if ok:
                tracker.clear()
            return ok

        pool.free_blocks, pool.get_new_blocks, pool.touch = freeing, getting, touching
        pool.evict_blocks, pool.reset_prefix_cache, pool.unpin_blocks = (
            evicting,
            resetting,
            unpinning,
        )

    def release(self) -> None:
        """Give vLLM back its own methods and drop every reference into its engine, so
        that the engine core (weights, KV pool) is freed once vLLM lets go of it too."""
        for owner, names in (
            (self.scheduler, ("schedule", "update_from_output")),
            (self.block_pool, _POOL_WRAPPED),
        ):
            for name in names:
                # The wrappers are instance attributes over the class's methods.
                owner.__dict__.pop(name, None)
        self.on_scheduled = None
        self._in_flight.clear()
        self._handed_out.clear()
        for group in self.groups:
            group.release()
        self.groups = ()
        self.core = self.scheduler = self.kv_manager = self.block_pool = None
        self.vllm_config = self.output_processor = None

    def block_cache(self) -> BlockCacheState | None:
        """Which free blocks hold a cached prefix, and which held ones were prefix hits."""
        return self.cache_tracker.state() if self.cache_tracker is not None else None

    def _summarize(self, out: Any, scheduled_at: float) -> ScheduledWork:
        scheduled: dict[str, int] = out.num_scheduled_tokens
        requests = self.scheduler.requests
        per_request: dict[str, tuple[int, int]] = {}
        # A new request's batch is its prompt (or, with the V2 model runner, a preempted
        # request's recompute): prefill, whatever part of it the prefix cache had.
        for new in out.scheduled_new_reqs:
            rid = new.req_id
            if rid in scheduled:
                per_request[rid] = (scheduled[rid], 0)
        cached = out.scheduled_cached_reqs
        for rid, before, outputs in zip(
            cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens, strict=False
        ):
            n = scheduled.get(rid, 0)
            if not n:
                continue
            request = requests.get(rid)
            prompt = int(request.num_prompt_tokens) if request is not None else before + n
            # The one new token of a decode step (or its speculative run); else the prompt,
            # or a preempted request recomputing its prompt and its own earlier output:
            # both are prefill work, whatever the token positions.
            per_request[rid] = (0, n) if decoding(prompt, int(before), int(outputs)) else (n, 0)
        for rid, n in scheduled.items():
            per_request.setdefault(rid, (n, 0))  # in neither list: not seen in vLLM 0.32
        prefill = sum(p for p, _ in per_request.values())
        decode = sum(d for _, d in per_request.values())
        preempted = tuple(sorted(out.preempted_req_ids or ()))
        waiting = tuple(str(r.request_id) for r in self.scheduler.waiting)
        return ScheduledWork(prefill, decode, preempted, per_request, waiting, scheduled_at)

    def started(self, work: ScheduledWork, external_id: dict[str, str], step: int) -> StepStarted:
        """The batch the scheduler just made, as a step that is running: its prompt chunks
        (chunk k of about n, the rest at the step's token budget), and the blocks its
        requests hold for it, read right after the scheduler gave them."""
        budget = max(1, int(self.vllm_config.scheduler_config.max_num_batched_tokens))
        requests = self.scheduler.requests
        for gone in [r for r in self._chunks_done if r not in requests]:
            del self._chunks_done[gone]
        chunks = []
        decoding_now = 0
        for rid, (p, d) in work.per_request.items():
            if d:
                decoding_now += 1
                self._chunks_done.pop(rid, None)
            if not p:
                continue
            request = requests.get(rid)
            after = int(request.num_computed_tokens) if request is not None else p
            total = int(request.num_tokens) if request is not None else p
            k = 1 if after - p <= 0 else self._chunks_done.get(rid, 0) + 1
            self._chunks_done[rid] = k
            left = max(0, total - after)
            chunks.append(
                PrefillChunk(external_id.get(rid, rid), p, k, k + math.ceil(left / budget), total)
            )
        drawn = self.groups[self.drawn] if self.groups else None
        if drawn is not None:
            drawn.new_step()
        blocks = []
        for rid in work.per_request:
            request = requests.get(rid)
            if request is None:
                continue
            ids = drawn.ids(rid) if drawn is not None else self._vllm_ids(rid)
            blocks.append(
                RequestBlocks(external_id.get(rid, rid), ids, int(request.num_computed_tokens))
            )
        return StepStarted(
            step=step,
            started_at=work.scheduled_at,
            prefill_tokens=work.prefill_tokens,
            decode_tokens=work.decode_tokens,
            chunks=tuple(chunks),
            decoding=decoding_now,
            blocks=tuple(blocks),
            free_blocks=int(self.block_pool.get_num_free_blocks()),
            total_blocks=self.total_blocks,
            block_cache=self.block_cache(),
        )

    def memory_budget(self) -> MemoryBudget | None:
        """The driver worker's memory at start-up, as vLLM accounted it, its weights
        checked against the model's config; None when the workers run in processes of
        their own (their figures stay there)."""
        from engine.memory_budget import (
            LOADED_TENSORS,
            VLLM_ACCOUNTING,
            choose_weights,
            config_weights,
        )
        from engine.model_geometry import config_fields

        executor = self.core.model_executor
        wrapper = getattr(executor, "driver_worker", None)
        worker = getattr(wrapper, "worker", None)
        runner = getattr(worker, "model_runner", None)
        if worker is None or runner is None:
            return None
        # The GPU runner measures its load; the CPU runner keeps no figure, so the loaded
        # tensors are counted. Those miss every linear weight the CPU backend handed to
        # oneDNN (it leaves an empty tensor in its place), hence the check below.
        weights = getattr(runner, "model_memory_usage", None)
        reported_by = VLLM_ACCOUNTING
        if not weights:
            model = runner.get_model()
            weights = sum(t.numel() * t.element_size() for t in model.parameters())
            weights += sum(t.numel() * t.element_size() for t in model.buffers())
            reported_by = LOADED_TENSORS
        model_config = self.vllm_config.model_config
        parallel = self.vllm_config.parallel_config
        # The count is the whole model at its dtype: it says nothing of a quantized model
        # (fewer bytes a weight) or of one rank's share.
        config = None
        if model_config.quantization is None and int(parallel.world_size) == 1:
            config = config_weights(
                config_fields(model_config.hf_text_config), int(model_config.dtype.itemsize)
            )
        weights, source = choose_weights(int(weights), reported_by, config)
        kv_config = self.scheduler.kv_cache_config
        pool = sum(int(t.size) for t in kv_config.kv_cache_tensors)
        snapshot = getattr(worker, "init_snapshot", None)
        requested = getattr(worker, "requested_memory", None)
        activations = getattr(worker, "peak_activation_memory", None)
        rank = int(getattr(worker, "local_rank", 0))
        # With --kv-cache-memory-bytes the GPU worker skips its profiling accounting and
        # never sets peak_activation_memory (gpu_worker.py, determine_available_memory):
        # the requested share was only checked at start-up, vLLM does not hold it.
        fixed = bool(self.vllm_config.cache_config.kv_cache_memory_bytes)
        return MemoryBudget(
            device=f"GPU {rank}" if snapshot is not None else "this machine's RAM",
            total_bytes=int(snapshot.total_memory) if snapshot is not None else None,
            requested_bytes=int(requested) if snapshot is not None and requested else None,
            weights_bytes=weights,
            activations_bytes=int(activations) if activations is not None else None,
            kv_pool_bytes=pool,
            kv_pool_tokens=self.kv_capacity_tokens or self.total_blocks * self.block_size,
            per_rank=int(parallel.world_size) > 1,
            source=source,
            pool_fixed=snapshot is not None and (fixed or activations is None),
        )

    @property
    def batches_queued(self) -> int:
        """Batches in vLLM's batch queue, not yet handed out (always 0 in lockstep). The
        step loop steps until none is left, as vLLM's own engine-core loop does: a batch
        left there while idle would come out with the next request, after the pause."""
        return len(self.core.batch_queue or ())

    def take_scheduled(self) -> ScheduledWork | None:
        """The batch whose tokens the last `step()` handed out; None when it handed out
        none (the first step after idle with a batch queue only schedules)."""
        done, self._handed_out = self._handed_out, []
        if not done:
            return None
        if len(done) == 1:
            return done[0]
        # More than one batch came back in one step (not seen in vLLM 0.32): count them all.
        per_request: dict[str, tuple[int, int]] = {}
        for work in done:
            for rid, (p, d) in work.per_request.items():
                old = per_request.get(rid, (0, 0))
                per_request[rid] = (old[0] + p, old[1] + d)
        return ScheduledWork(
            sum(w.prefill_tokens for w in done),
            sum(w.decode_tokens for w in done),
            tuple(sorted({i for w in done for i in w.preempted_internal_ids})),
            per_request,
            done[-1].waiting_internal_ids,
            min(w.scheduled_at for w in done),
            max(w.number for w in done),
            summed_perf([w.perf for w in done]),
        )

    @property
    def batch_queue_depth(self) -> int:
        """How many batches the engine core keeps in flight: 1 steps in lockstep; 2 is
        async scheduling (CUDA's default) or pipeline parallelism."""
        queue = self.core.batch_queue
        return int(self.core.batch_queue_size) if queue is not None else 1

    @property
    def async_scheduling(self) -> bool:
        return bool(self.vllm_config.scheduler_config.async_scheduling)

    def request_stats(self, internal_id: str) -> Any | None:
        """vLLM's own `RequestStateStats` of a live request (arrival time, engine-core
        timestamps of its tokens); the object outlives the request, so keep it."""
        state = self.output_processor.request_states.get(internal_id)
        return getattr(state, "stats", None)

    @property
    def block_size(self) -> int:
        """Tokens per block of the drawn group (vLLM's cache block size for one group)."""
        if self.groups:
            return self.groups[self.drawn].block_size
        return int(self.vllm_config.cache_config.block_size)

    @property
    def kv_groups(self) -> tuple[KvCacheGroup, ...]:
        return tuple(
            KvCacheGroup(g.kind, g.block_size, g.num_layers, drawn=i == self.drawn)
            for i, g in enumerate(self.groups)
        )

    @property
    def kv_capacity_tokens(self) -> int:
        """vLLM's own token capacity of the pool when it has several groups (a request
        holds blocks in each, so blocks x block size overstates it); 0 for one group,
        where blocks x block size is the capacity."""
        if len(self.groups) < 2:
            return 0
        return int(self.vllm_config.cache_config.kv_cache_size_tokens or 0)

    @property
    def total_blocks(self) -> int:
        return int(self.block_pool.num_gpu_blocks) - 1  # minus the null block

    def free_blocks(self) -> int:
        """Free blocks as the last step left them: blocks that a batch still in flight
        took (see `live_blocks`, read first) count as free."""
        ahead = self.blocks_ahead if self._in_flight else 0
        return int(self.block_pool.get_num_free_blocks()) + ahead

    def usage(self) -> float:
        if not (self.blocks_ahead and self._in_flight):
            return float(self.block_pool.get_usage())
        return 1.0 - self.free_blocks() / max(self.total_blocks, 1)

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def num_waiting(self) -> int:
        return int(self.scheduler.get_request_counts()[1])

    def live_blocks(self, external_id: dict[str, str]) -> tuple[RequestBlocks, ...]:
        """Block IDs of every running request in the drawn group, keyed by the caller's
        request IDs."""
        self._since_rebuild += 1
        if self._since_rebuild >= self._rebuild_every:
            for group in self.groups:
                group.forget()
            self._since_rebuild = 0
        drawn = self.groups[self.drawn] if self.groups else None
        if drawn is not None:
            drawn.new_step()
        result = []
        seen = set()
        ahead = self._tokens_in_flight()
        self.blocks_ahead = 0
        for request in self.scheduler.running:
            rid = request.request_id
            seen.add(rid)
            ids = drawn.ids(rid) if drawn is not None else self._vllm_ids(rid)
            tokens = int(request.num_computed_tokens)
            if rid in ahead:
                # A batch still in flight already counts its tokens and holds their blocks;
                # the step being shown is the batch before it, so show the request as it was.
                tokens -= ahead[rid]
                ids = self._as_before(rid, ids, max(tokens, 0))
                if tokens <= 0:
                    continue  # its first batch is the one in flight: it was waiting then
            result.append(RequestBlocks(external_id.get(rid, rid), ids, tokens))
        if drawn is not None:
            drawn.keep_only(seen)
        return tuple(result)

    def _as_before(self, rid: str, ids: tuple[int, ...], tokens: int) -> tuple[int, ...]:
        """`ids` without the blocks past `tokens` (taken for a batch in flight), which are
        added to `blocks_ahead`, in every group."""
        if not self.groups:
            keep = -(-tokens // self.block_size)
            self.blocks_ahead += max(0, len(ids) - keep)
            return ids[:keep]
        for i, group in enumerate(self.groups):
            later = group.held_from(rid, -(-tokens // group.block_size))
            self.blocks_ahead += later
            if i == self.drawn and later:
                ids = ids[: len(ids) - later]
        return ids

    def _tokens_in_flight(self) -> dict[str, int]:
        """Tokens each request has in batches scheduled but not handed out (none in
        lockstep, where a step's batch is handed out before the step ends)."""
        ahead: dict[str, int] = {}
        for _out, work in self._in_flight.values():
            for rid, (p, d) in work.per_request.items():
                ahead[rid] = ahead.get(rid, 0) + p + d
        return ahead

    def _vllm_ids(self, rid: str) -> tuple[int, ...]:
        # vLLM's own copy (no coordinator to read): its first group.
        groups = self.kv_manager.get_block_ids(rid)
        return tuple(b - 1 for b in (groups[0] if groups else ()) if b > 0)


class GroupReader:
    """One KV cache group's per-request block lists, read cheaply step after step.

    A step mostly appends blocks, so a read reuses the tuple of a request's IDs from the last
    read and appends the new ones (copying every request's whole list each step costs 3 ms at
    256 requests x 256 blocks). How a group's manager may change a list in place decides
    what a reuse checks first (`in_place`):
      "none"      full attention only appends until the request ends: nothing to check.
      "head"      a sliding window or chunked local attention swaps the blocks that left its
                  window for the null block, from the head: a reuse checks that the first
                  block kept last time is still in its place (one identity test), and reads
                  the list again when it is not.
      "anywhere"  R-SWA nulls a gap in the middle, Mamba its older state blocks: read in
                  full every step.
    """

    def __init__(
        self,
        manager: Any,
        block_size: int,
        *,
        kind: str = "full attention",
        num_layers: int = 0,
        in_place: str = "none",
    ) -> None:
        self.manager = manager
        self.block_size = block_size
        self.kind = kind
        self.num_layers = num_layers
        self._table: Any = manager.req_to_blocks
        self._head = in_place == "head"
        self._anywhere = in_place == "anywhere"
        # Per request: (vLLM's list object, its length, the IDs, the position of the first
        # kept block and that block; -1 and None when nothing is checked or none is kept).
        self._known: dict[str, tuple[object, int, tuple[int, ...], int, object]] = {}

    def new_step(self) -> None:
        """Before a step's reads (vLLM's table object, looked up once a step)."""
        self._table = self.manager.req_to_blocks

    def ids(self, rid: str) -> tuple[int, ...]:
        """The request's block IDs in this group, vLLM's minus one, null blocks left out."""
        blocks: Any = self._table.get(rid) or ()
        n = len(blocks)
        entry = self._known.get(rid)
        # (`id()` rather than `is`, which would narrow `blocks` to `object` for mypy.)
        if (
            entry is not None
            and id(entry[0]) == id(blocks)
            and entry[1] <= n
            and (entry[3] < 0 or blocks[entry[3]] is entry[4])
        ):
            old, ids, head, first = entry[1], entry[2], entry[3], entry[4]
            if old == n:
                return ids
            ids += tuple(b.block_id - 1 for b in blocks[old:] if b.block_id > 0)
            if self._head and head < 0 and ids:
                head = _first_kept(blocks, old)
                first = blocks[head]
        else:
            ids = tuple(b.block_id - 1 for b in blocks if b.block_id > 0)
            if self._anywhere:
                return ids
            head, first = -1, None
            if self._head and ids:
                head = _first_kept(blocks, 0)
                first = blocks[head]
        self._known[rid] = (blocks, n, ids, head, first)
        return ids

    def held_from(self, rid: str, position: int) -> int:
        """How many blocks the request holds at list positions from `position` on."""
        blocks: Any = self.manager.req_to_blocks.get(rid) or ()
        return sum(1 for b in blocks[position:] if b.block_id > 0)

    def keep_only(self, live: set[str]) -> None:
        for gone in self._known.keys() - live:
            del self._known[gone]

    def forget(self) -> None:
        self._known.clear()

    def release(self) -> None:
        """Drop the manager and its lists (the engine is shutting down)."""
        self._known.clear()
        self.manager = self._table = None


def _first_kept(blocks: Any, start: int) -> int:
    return next(i for i in range(start, len(blocks)) if blocks[i].block_id > 0)


def drawn_group(groups: tuple[GroupReader, ...]) -> int:
    """The group whose IDs the block map draws: the first full-attention group when there
    is one, since it holds a block for every token of the context (a sliding-window group
    holds only its window, a Mamba group a state or two), so its blocks follow the request's
    length as the map and its legend count it; group 0 otherwise. One group: that one."""
    return next((i for i, g in enumerate(groups) if g.kind in WHOLE_CONTEXT), 0)


_POOL_WRAPPED = (
    "free_blocks",
    "get_new_blocks",
    "touch",
    "evict_blocks",
    "reset_prefix_cache",
    "unpin_blocks",
)
"""The block pool's methods `_wrap_pool` wraps."""

WHOLE_CONTEXT = frozenset({"full attention", "MLA attention", "sink full attention"})
"""Group kinds (`group_kind`) that keep a block for every token of a request."""


def group_readers(kv_manager: Any) -> tuple[GroupReader, ...]:
    """A reader for each of vLLM's KV cache groups, in vLLM's group order."""
    from vllm.v1.core.single_type_kv_cache_manager import (
        ChunkedLocalAttentionManager,
        FullAttentionManager,
        RSWAManager,
        SlidingWindowManager,
    )

    try:
        coordinator = kv_manager.coordinator
        managers = coordinator.single_type_managers
        specs = coordinator.kv_cache_config.kv_cache_groups
    except AttributeError:
        return ()
    readers = []
    for manager, spec in zip(managers, specs, strict=False):
        in_place = "anywhere"  # a manager not named here: read it in full every step
        if isinstance(manager, RSWAManager):
            pass
        elif isinstance(manager, FullAttentionManager):
            in_place = "none"
        elif isinstance(manager, SlidingWindowManager | ChunkedLocalAttentionManager):
            in_place = "head"
        readers.append(
            GroupReader(
                manager,
                int(manager.block_size),
                kind=group_kind(spec.kv_cache_spec),
                num_layers=len(spec.layer_names),
                in_place=in_place,
            )
        )
    return tuple(readers)


def group_kind(spec: Any) -> str:
    """A group's attention type in words: "full attention", "sliding window 4096", "mamba"."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        KVCacheSpecKind,
        RSWASpec,
        SlidingWindowSpec,
        get_kv_cache_spec_kind,
    )

    kind = get_kv_cache_spec_kind(spec)
    if isinstance(spec, RSWASpec):
        return f"reference sliding window {spec.rswa_window}"
    if isinstance(spec, SlidingWindowSpec):
        return f"{kind.value.replace('_', ' ')} {spec.sliding_window}"
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return f"chunked local attention {spec.attention_chunk_size}"
    if kind is KVCacheSpecKind.MLA_ATTENTION:
        return "MLA attention"
    return str(kind.value).replace("_", " ")
