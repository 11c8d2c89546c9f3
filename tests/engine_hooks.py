"""Hooks into the session's real engine, run on its step thread between steps."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.vllm.engine import VllmEngine


def on_step_thread(engine: VllmEngine, call: Any) -> None:
    """Run `call(llm_engine)` on the engine's step thread, between steps, and wait."""
    done = threading.Event()

    def run(llm_engine: Any) -> None:
        try:
            call(llm_engine)
        finally:
            done.set()

    engine._commands.put(("call", run))
    assert done.wait(60), "the step thread did not take the call"


SCHEDULING_MODES = ("lockstep", "batch-queue", "async")
"""How the session engine schedules, for tests that run in each:
  lockstep     vLLM's CPU default: `Scheduler`, `step()` schedules and runs one batch.
  batch-queue  `Scheduler` in a batch queue of two (pipeline parallelism's path).
  async        vLLM's own `AsyncScheduler` in a batch queue of two: CUDA's default path,
               output placeholders and a decode scheduled before the last token is known.
"""


def set_scheduling(engine: VllmEngine, mode: str) -> None:
    """Put the session engine's core into `mode` (see SCHEDULING_MODES), between steps.

    The scheduler object stays the one vLLM built; for "async" its class becomes vLLM's
    `AsyncScheduler`, whose `__init__` adds three attributes to `Scheduler`'s (set here as
    it sets them) and whose two overrides then run as vLLM's own code. `schedule` and
    `update_from_output`, which kvscope wraps, are `Scheduler`'s in both classes.
    """
    assert mode in SCHEDULING_MODES, mode
    left: list[int] = []

    def switch(llm_engine: Any) -> None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        core = llm_engine.engine_core.engine_core
        # Asserted by the caller: a failed assert here would end the step thread.
        left.append(len(core.batch_queue or ()))
        scheduler: Any = core.scheduler
        now: object = type(scheduler)
        if mode == "async":
            if now is Scheduler:
                scheduler.__class__ = AsyncScheduler
                scheduler._spec_token_placeholders = [-1] * scheduler.num_spec_tokens
                scheduler.pp_size = scheduler.parallel_config.pipeline_parallel_size
                scheduler.decode_stagger = scheduler.pp_size
        elif now is AsyncScheduler:
            scheduler.__class__ = Scheduler
        depth = 1 if mode == "lockstep" else 2
        if depth > 1:
            core.batch_queue = deque(maxlen=depth)
            core.batch_queue_size = depth
            core.step_fn = core.step_with_batch_queue
        else:
            core.batch_queue = None
            core.batch_queue_size = 1
            core.step_fn = core.step

    wait_until_drained(engine)
    on_step_thread(engine, switch)
    assert left == [0], f"{left[0]} batch(es) still in vLLM's queue"


def wait_until_drained(engine: VllmEngine, turns: int = 8) -> None:
    """Once the last request has ended, the step loop keeps stepping until vLLM's batch
    queue is empty (a reply that stopped on EOS leaves a batch there with async
    scheduling); a batch left there while idle would come out with the next request,
    after the pause. Each look is one turn of the step loop, so a loop that drains takes
    one or two; one that does not never gets there."""
    left: list[int] = []

    def look(llm_engine: Any) -> None:
        left.append(len(llm_engine.engine_core.engine_core.batch_queue or ()))

    for _ in range(turns):
        on_step_thread(engine, look)
        if left[-1] == 0:
            return
    raise AssertionError(f"vLLM's batch queue still holds {left[-1]} batch(es) after {turns} turns")


def set_batch_queue(engine: VllmEngine, depth: int) -> None:
    """`Scheduler` in a batch queue of `depth` (1: lockstep)."""
    set_scheduling(engine, "lockstep" if depth == 1 else "batch-queue")


@contextlib.contextmanager
def scheduling(engine: VllmEngine, mode: str) -> Iterator[VllmEngine]:
    """The session engine in `mode` for the block, back in lockstep afterwards."""
    set_scheduling(engine, mode)
    try:
        yield engine
    finally:
        set_scheduling(engine, "lockstep")


class PoolHeld:
    """Most of the session engine's KV pool taken out of use, so that a test can fill the
    rest with a few short requests (a preemption costs seconds, not a 5,600-token prefill).

    The blocks are taken from vLLM's own free list on the step thread and given back on
    exit; the scheduler sees only `keep_free` free blocks meanwhile.
    """

    def __init__(self, engine: VllmEngine, keep_free: int) -> None:
        self.engine = engine
        self.keep_free = keep_free
        self._blocks: list[Any] = []

    def __enter__(self) -> PoolHeld:
        def take(llm_engine: Any) -> None:
            pool = llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
            spare = pool.get_num_free_blocks() - self.keep_free
            assert spare >= 0, "the pool is already smaller than asked"
            self._blocks = pool.get_new_blocks(spare)

        on_step_thread(self.engine, take)
        return self

    def __exit__(self, *exc: object) -> None:
        def give_back(llm_engine: Any) -> None:
            pool = llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
            pool.free_blocks(self._blocks)
            self._blocks = []

        on_step_thread(self.engine, give_back)
