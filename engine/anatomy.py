"""TTFT anatomy: where a request's time to first token went, booked step by step."""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import TtftAnatomy


@dataclass
class AnatomyClock:
    """Books every moment from stream() to the first token into one TTFT part: queue, own
    prefill share, others' share, preemption. Both in-process engines feed it step by
    step, so their breakdowns mean the same and add up to the TTFT."""

    cursor: float  # everything before this is booked
    scheduled: bool = False
    preempted: bool = False
    queue_s: float = 0.0
    prefill_s: float = 0.0
    chunks: int = 0
    others_s: float = 0.0
    preempted_s: float = 0.0

    def _idle(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.preempted:
            self.preempted_s += seconds
        elif self.scheduled:
            self.others_s += seconds
        else:
            self.queue_s += seconds

    def lose_output(self, at: float) -> None:
        """Preempted after its first token: the fake throws its output away, so the TTFT
        is measured again to the recomputed first token; the time since that first token
        was spent on output now lost."""
        self.preempted_s += max(0.0, at - self.cursor)
        self.cursor = max(self.cursor, at)
        self.preempted = True

    def step(self, started: float, ended: float, own: int, total: int, preempted: bool) -> None:
        self._idle(started - self.cursor)
        self.preempted = self.preempted or preempted
        # Only what is not booked yet: a stalled first token may have moved the cursor
        # past this step's start. Every part grows exactly as the cursor moves, so the
        # parts add up to the TTFT.
        duration = max(0.0, ended - max(started, self.cursor))
        if own > 0:
            mine = duration * own / max(total, 1)
            if self.preempted:
                self.preempted_s += mine  # recompute: work lost to the preemption
            else:
                self.prefill_s += mine
                self.chunks += 1
            self.others_s += duration - mine
            self.scheduled = True
        else:
            self._idle(duration)
        self.cursor = max(self.cursor, ended)

    def first_token(self, at: float) -> None:
        """A scripted stall delays the first token past its step's end: others' time."""
        self.others_s += max(0.0, at - self.cursor)
        self.cursor = max(self.cursor, at)

    def result(self) -> TtftAnatomy:
        return TtftAnatomy(
            self.queue_s, self.prefill_s, self.chunks, self.others_s, self.preempted_s
        )
