"""What the engine itself saw while a load point ran: batch, queue and KV, from its steps.

An engine with exact steps hands over every step sample; a remote server only its
/metrics scrapes. Either way `StepTaps` collects them during the point and `step_view`
sums them up as the point's `StepView`, with how many requests waited behind a step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from bench.load_result import StepView
from engine.stats import mean

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from bench.load_loops import SentRequest
    from engine.events import ScrapeSample, StepSample
    from engine.protocol import Engine

POLL_S = 0.02


@dataclass
class StepTaps:
    """The engine's own view while a point runs: its step samples or its scrapes."""

    steps: list[StepSample] = field(default_factory=list)
    scrapes: list[ScrapeSample] = field(default_factory=list)
    removers: list[Callable[[], None]] = field(default_factory=list)
    scraping: bool = False  # listening to a server's scrapes (no steps to see)

    def attach(self, engine: Engine) -> None:
        features = engine.features
        # Listeners run on the engine's thread: a list append is all they do.
        if features.exact_steps:
            self.removers.append(engine.add_step_listener(self.steps.append))
        elif features.remote is not None:
            self.removers.append(features.remote.add_scrape_listener(self.scrapes.append))
            self.scraping = True

    async def last_window(self, windows: int = 2, timeout_s: float = 2.0) -> None:
        """Attached, wait for `windows` more scrapes: the work of the point's last moments
        is in a window that closes after it (one scrape may have been under way as the
        point ended), and the point's FLOP counts would miss its tail. No wait in-process,
        where each step is handed over as it ends."""
        if not self.scraping or not self.removers:
            return
        until = len(self.scrapes) + windows
        # Polled: the scrapes arrive on the scraper's thread, which only appends to a list.
        for _ in range(max(1, round(timeout_s / POLL_S))):
            if len(self.scrapes) >= until:
                return
            await asyncio.sleep(POLL_S)

    def detach(self) -> None:
        for remove in self.removers:
            remove()
        self.removers.clear()


def step_view(
    taps: StepTaps, start: float, done: Sequence[SentRequest]
) -> tuple[StepView | None, int]:
    """The engine's view over the point, and how many requests waited behind a step."""
    steps = [s for s in taps.steps if not s.idle and s.started_at >= start - 1e-9]
    if steps:
        total = sum(s.duration_s for s in steps)
        waiting = [s for s in steps if s.waiting > 0]
        sent_at = {s.request.request_id: start + s.sent_s for s in done if s.finished is not None}
        need = {
            s.request.request_id: len(s.request.prompt_token_ids or ()) for s in done
        }  # fmt: skip
        # A waiting step is short of KV when the queue's head (the request the scheduler
        # admits next) does not fit. A head this point did not send, or one without token
        # IDs, counts as 0 tokens, so it never blames the pool: the step counts as
        # budget-bound, as it always has.
        kv_short = sum(
            1 for s in waiting if s.waiting_ids and s.short_of_kv(need.get(s.waiting_ids[0], 0))
        )
        view = _occupancy(
            "steps",
            steps,
            preemptions=sum(s.preemptions for s in steps),
            prefill_time_share=(
                sum(s.duration_s for s in steps if s.prefill_tokens) / total if total else 0.0
            ),
            waiting_step_share=len(waiting) / len(steps),
            kv_bound_share=kv_short / len(waiting) if waiting else 0.0,
            budget_bound_share=(len(waiting) - kv_short) / len(waiting) if waiting else 0.0,
        )
        return view, _queued(steps, sent_at)
    scrapes = [s for s in taps.scrapes if s.time_s >= start]
    if scrapes:
        view = _occupancy("scrapes", scrapes, preemptions=sum(s.new_preemptions for s in scrapes))
        return view, 0
    return None, 0


def _occupancy(
    source: Literal["steps", "scrapes"],
    rows: Sequence[StepSample] | Sequence[ScrapeSample],
    *,
    preemptions: int,
    **shares: float | None,
) -> StepView:
    """Batch, queue and KV over a point, from step samples or /metrics scrapes alike."""
    return StepView(
        source=source,
        samples=len(rows),
        mean_running=mean([float(r.running) for r in rows]),
        max_running=max(r.running for r in rows),
        mean_waiting=mean([float(r.waiting) for r in rows]),
        max_waiting=max(r.waiting for r in rows),
        mean_kv_usage=mean([r.kv_usage for r in rows]),
        max_kv_usage=max(r.kv_usage for r in rows),
        preemptions=preemptions,
        **shares,
    )


def _queued(steps: list[StepSample], sent_at: dict[str, float]) -> int:
    """Requests that a step started after their send left out: they waited for others,
    in the engine's queue or for KV blocks (a request sent during a step waits for
    that step to end, which is not queueing)."""
    first: dict[str, float] = {}
    for s in steps:
        for w in s.work:
            first.setdefault(w.request_id, s.started_at)
    queued = 0
    for rid, sent in sent_at.items():
        began = first.get(rid)
        if began is None:
            continue
        if any(sent <= s.started_at < began for s in steps):
            queued += 1
    return queued
