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

    on_step_thread(engine, switch)
