"""Ring buffers of what the engine did, filled by message handlers, read by a redraw timer.

Handlers only append here (cheap, once per event); the plots and the block map read these
buffers at most ~15 times a second, and only when a `*_version` counter moved. That keeps
the cost of drawing bounded however fast tokens and steps arrive.
"""

from __future__ import annotations

from collections import deque

from engine.events import RequestFinished, StepSample, TokenEvent


class Telemetry:
    """Everything the engine panel draws, kept for the session in bounded buffers."""

    def __init__(self, *, steps: int = 2048, itl: int = 8192, ttft: int = 4096) -> None:
        # Plain floats, not the StepSamples themselves: a sample holds a dozen small objects
        # the garbage collector would have to walk through, thousands of times over.
        self.kv_t: deque[float] = deque(maxlen=steps)
        self.kv_pct: deque[float] = deque(maxlen=steps)
        self.preempt_t: deque[float] = deque(maxlen=steps)
        self.latest: StepSample | None = None
        # Requests known to have finished. A finished request's blocks are back in the pool
        # even if the latest sample still lists it: the sample (a message) and the finish
        # (a stream event) travel separately, and the sample may be the later to arrive.
        self.finished: set[str] = set()
        self._finished_order: deque[str] = deque()
        self.itl_request: str | None = None
        self.itl_ms: deque[float] = deque(maxlen=itl)
        self.ttft_points: deque[tuple[int, float]] = deque(maxlen=ttft)
        self.preemptions_total = 0
        self.t0: float | None = None
        self.steps_version = 0
        self.itl_version = 0
        self.ttft_version = 0

    def add_sample(self, sample: StepSample) -> None:
        if self.t0 is None:
            self.t0 = sample.started_at
        t = sample.started_at + sample.duration_s - self.t0
        self.kv_t.append(t)
        self.kv_pct.append(sample.kv_usage * 100.0)
        if sample.preemptions:
            self.preempt_t.append(t)
        self.latest = sample
        self.preemptions_total += sample.preemptions
        self.steps_version += 1

    def track_request(self, request_id: str) -> None:
        """Make `request_id` the one whose ITL the plot shows."""
        self.itl_request = request_id
        self.itl_ms.clear()
        self.itl_version += 1

    def add_token(self, event: TokenEvent) -> None:
        # Index 0's latency is the time to first token, not an inter-token latency.
        if event.request_id == self.itl_request and event.index > 0:
            self.itl_ms.append(event.latency_s * 1000.0)
            self.itl_version += 1

    def add_finished(self, event: RequestFinished, keep: int = 4096) -> None:
        self.finished.add(event.request_id)
        self._finished_order.append(event.request_id)
        if len(self._finished_order) > keep:
            self.finished.discard(self._finished_order.popleft())
        self.steps_version += 1
        if event.ttft_s is not None:
            self.ttft_points.append((event.prompt_tokens, event.ttft_s * 1000.0))
            self.ttft_version += 1

    def kv_series(self) -> tuple[list[float], list[float], list[float]]:
        """(seconds since the first step, KV usage %, times of steps that preempted)."""
        first = self.kv_t[0] if self.kv_t else 0.0
        # Preemption marks older than the KV window would fall off the plot's left edge.
        marks = [t for t in self.preempt_t if t >= first]
        return list(self.kv_t), list(self.kv_pct), marks
