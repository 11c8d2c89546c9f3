"""vLLM's own per-request figures, kept beside kvscope's as a standing check.

kvscope passes `KvscopeStatLogger` to `LLMEngine.from_engine_args(stat_loggers=...)`. vLLM
calls `record()` on the step thread, inside `step()`, with each iteration's stats; the
finished requests' queue and prefill times are kept here until the step loop reads them.
Per-token figures (vLLM's TTFT and its inter-token latencies, from the engine core's own
timestamps) come from each request's `RequestStateStats`, read in `internals.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase


@dataclass(frozen=True, slots=True)
class FinishedInVllm:
    queue_s: float
    prefill_s: float
    e2e_s: float
    output_tokens: int


class KvscopeStatLogger(StatLoggerBase):
    """Keeps each finished request's vLLM-side times, by vLLM's internal request ID."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.finished: dict[str, FinishedInVllm] = {}

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if iteration_stats is None:
            return
        for f in iteration_stats.finished_requests:
            if f.request_id is None:
                continue
            self.finished[str(f.request_id)] = FinishedInVllm(
                queue_s=float(f.queued_time),
                prefill_s=float(f.prefill_time),
                e2e_s=float(f.e2e_latency),
                output_tokens=int(f.num_generation_tokens),
            )

    def take(self, internal_id: str) -> FinishedInVllm | None:
        return self.finished.pop(internal_id, None)

    def log_engine_initialized(self) -> None:
        pass
