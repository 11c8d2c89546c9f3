"""Hooks into the session's real engine, run on its step thread between steps."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def set_batch_queue(engine: VllmEngine, depth: int) -> None:
    def switch(llm_engine: Any) -> None:
        core = llm_engine.engine_core.engine_core
        if depth > 1:
            core.batch_queue = deque(maxlen=depth)
            core.batch_queue_size = depth
            core.step_fn = core.step_with_batch_queue
        else:
            core.batch_queue = None
            core.batch_queue_size = 1
            core.step_fn = core.step
        # Batches the old mode had in flight are gone with its queue: the step pairing
        # must not wait for their outputs.
        engine.introspection._in_flight.clear()

    on_step_thread(engine, switch)


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
