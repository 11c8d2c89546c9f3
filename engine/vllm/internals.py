"""The one module that reaches into vLLM's unversioned internals.

Scheduler, KV-cache manager and block pool are not public API. Everything kvscope needs
from them is read here, so a vLLM upgrade that moves them breaks this file alone, and
tests/test_vllm_engine.py::test_vllm_internals_are_where_kvscope_expects says so.

Block IDs: vLLM's pool reserves physical block 0 as a "null block" that no request ever
holds. kvscope reports the usable pool as blocks 0..N-1, i.e. vLLM's ID minus one, so a
block map can draw exactly `total_blocks` cells.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.events import RequestBlocks


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    prefill_tokens: int
    decode_tokens: int
    preempted_internal_ids: tuple[str, ...]
    # Per scheduled request (vLLM's internal ID): (prefill tokens, decode tokens).
    per_request: dict[str, tuple[int, int]] = field(default_factory=dict)
    waiting_internal_ids: tuple[str, ...] = ()
    scheduled_at: float = 0.0  # perf_counter when the scheduler made this batch


def decoding(request: Any, computed_before: int) -> bool:
    """Whether a scheduled request is making its next output token, not (re)computing its
    prompt. With async scheduling, tokens in flight are placeholders that the request's
    own token count does not include yet; they count as output here."""
    in_flight = int(request.num_output_placeholders)
    outputs = int(request.num_output_tokens) + in_flight
    return outputs > 0 and computed_before >= int(request.num_tokens) + in_flight - 1


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
        # Batches scheduled and not yet handed out, by the scheduler output's identity (the
        # output object is kept with its summary, so the identity stays unique), and the
        # summaries of the batches whose outputs came back since the last step was read.
        self._in_flight: dict[int, tuple[object, ScheduledWork]] = {}
        self._handed_out: list[ScheduledWork] = []
        self.blocks_ahead = 0
        """Blocks the last `live_blocks` left out: held for a batch still in flight."""
        # Per request: (vLLM's block list object, its length, the IDs as a tuple). A step
        # only appends blocks, so most steps reuse the tuple and new blocks are appended;
        # copying every request's whole list each step costs 3 ms at 256 x 256 blocks.
        self._known: dict[str, tuple[object, int, tuple[int, ...]]] = {}
        self._rebuild_every = 64
        self._since_rebuild = 0
        self._wrap_schedule()

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
                self._in_flight[id(out)] = (out, self._summarize(out, at))
            except Exception:  # never let bookkeeping break the engine
                self._in_flight.pop(id(out), None)
            return out

        def updated(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            entry = self._in_flight.pop(id(scheduler_output), None)
            if entry is not None:
                self._handed_out.append(entry[1])
            return update(scheduler_output, *args, **kwargs)

        self.scheduler.schedule = scheduled
        self.scheduler.update_from_output = updated

    def _summarize(self, out: Any, scheduled_at: float) -> ScheduledWork:
        before: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            before[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for rid, n in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            before[rid] = n
        prefill = decode = 0
        per_request: dict[str, tuple[int, int]] = {}
        for rid, scheduled in out.num_scheduled_tokens.items():
            request = self.scheduler.requests.get(rid)
            done = before.get(rid, 0)
            if request is None:
                own = (scheduled, 0)
            elif decoding(request, done):
                # The one new token of a decode step (or its speculative run).
                own = (0, scheduled)
            else:
                # The prompt, or a preempted request recomputing its prompt and its own
                # earlier output: both are prefill work, whatever the token positions.
                own = (scheduled, 0)
            per_request[rid] = own
            prefill += own[0]
            decode += own[1]
        preempted = tuple(sorted(out.preempted_req_ids or ()))
        waiting = tuple(str(r.request_id) for r in self.scheduler.waiting)
        return ScheduledWork(prefill, decode, preempted, per_request, waiting, scheduled_at)

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
        return int(self.vllm_config.cache_config.block_size)

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

    def _req_to_blocks(self) -> Any | None:
        try:
            return self.kv_manager.coordinator.single_type_managers[0].req_to_blocks
        except (AttributeError, IndexError):
            return None

    def live_blocks(self, external_id: dict[str, str]) -> tuple[RequestBlocks, ...]:
        """Block IDs of every running request, keyed by the caller's request IDs."""
        table = self._req_to_blocks()
        self._since_rebuild += 1
        if self._since_rebuild >= self._rebuild_every:
            # A full re-read now and then, in case vLLM changed a list in place
            # (a sliding window swaps old blocks for the null block).
            self._known.clear()
            self._since_rebuild = 0
        result = []
        known = self._known
        seen = set()
        ahead = self._tokens_in_flight()
        size = self.block_size
        self.blocks_ahead = 0
        for request in self.scheduler.running:
            rid = request.request_id
            seen.add(rid)
            ids = self._ids_of(rid, table, known)
            tokens = int(request.num_computed_tokens)
            if rid in ahead:
                # A batch still in flight already counts its tokens and holds their blocks;
                # the step being shown is the batch before it, so show the request as it was.
                tokens -= ahead[rid]
                keep = -(-max(tokens, 0) // size)
                self.blocks_ahead += max(0, len(ids) - keep)
                ids = ids[:keep]
                if tokens <= 0:
                    continue  # its first batch is the one in flight: it was waiting then
            result.append(RequestBlocks(external_id.get(rid, rid), ids, tokens))
        for gone in known.keys() - seen:
            del known[gone]
        return tuple(result)

    def _tokens_in_flight(self) -> dict[str, int]:
        """Tokens each request has in batches scheduled but not handed out (none in
        lockstep, where a step's batch is handed out before the step ends)."""
        ahead: dict[str, int] = {}
        for _out, work in self._in_flight.values():
            for rid, (p, d) in work.per_request.items():
                ahead[rid] = ahead.get(rid, 0) + p + d
        return ahead

    def _ids_of(
        self, rid: str, table: Any, known: dict[str, tuple[object, int, tuple[int, ...]]]
    ) -> tuple[int, ...]:
        if table is None:
            groups = self.kv_manager.get_block_ids(rid)
            return tuple(b - 1 for b in (groups[0] if groups else ()) if b > 0)
        blocks: Any = table.get(rid) or ()
        n = len(blocks)
        entry = known.get(rid)
        # (`id()` rather than `is`, which would narrow `blocks` to `object` for mypy.)
        if entry is not None and id(entry[0]) == id(blocks) and entry[1] <= n:
            if entry[1] == n:
                return entry[2]
            ids = entry[2] + tuple(b.block_id - 1 for b in blocks[entry[1] :] if b.block_id > 0)
        else:
            ids = tuple(b.block_id - 1 for b in blocks if b.block_id > 0)
        known[rid] = (blocks, n, ids)
        return ids
