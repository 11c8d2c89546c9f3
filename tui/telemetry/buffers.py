"""Ring buffers of what the engine did, filled by message handlers, read by a redraw timer.

Handlers only append here (cheap, once per event); the plots and the block map read these
buffers at most ~15 times a second, and only when a `*_version` counter moved. That keeps
the cost of drawing bounded however fast tokens and steps arrive.

Every panel reads `latest`, the one newest StepSample: the status line, the block map and
the KV plot's "now" all describe the same step. The engines send a last idle sample when
their last request ends or is aborted, so an idle engine is shown as idle everywhere.

`Telemetry` is the aggregate the panels are given: beside its own buffers it holds the
request `Timeline` (timeline.py, beside this module), the `HostWatch` (host_watch.py) and
the tracked reply's tokens, from which the token explainer (token_explainer.py) names why
one token waited.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.stats import percentile
from tui.telemetry.host_watch import HostWatch
from tui.telemetry.perf_agreement import PerfAgreement
from tui.telemetry.preemption import Preemption, cost_of, observe
from tui.telemetry.prefill_fit import PrefillSteps
from tui.telemetry.request_status import RequestStatus, RequestTrack, RequestTracker
from tui.telemetry.timeline import Timeline
from tui.telemetry.token_explainer import TokenMark, explain_token

if TYPE_CHECKING:
    from engine.events import (
        RequestAccepted,
        RequestFinished,
        StepSample,
        StepStarted,
        TokenEvent,
    )

StepKind = Literal["prefill", "decode", "mixed"]
"""What a step ran: prompt tokens only, decode tokens only, or both (the roofline's colours)."""

KV_WINDOW_S = 60.0
"""The KV-usage plot shows the last minute of engine time, like btop, not the session."""


@dataclass(frozen=True)
class LatencyPoint:
    """One finished request on the latency-vs-prompt-tokens plot."""

    request_id: str
    prompt_tokens: int
    ttft_ms: float | None  # as the user felt it: from stream() to the first token
    median_itl_ms: float | None
    queue_ms: float | None  # time before the engine first scheduled it, where known
    queued: bool  # at least one step ran without it: other requests went first
    host_busy: str | None = None
    """Why the host was busy when it finished ("load 3.0 on 2 cores"), or None: its
    timings are then the host's as much as the engine's, and the plot draws it apart."""

    @property
    def service_ttft_ms(self) -> float | None:
        """TTFT with the queue time split off (the prefill's own cost), where known."""
        if self.ttft_ms is None:
            return None
        if self.queued and self.queue_ms is not None:
            return max(0.0, self.ttft_ms - self.queue_ms)
        return self.ttft_ms


@dataclass(frozen=True, slots=True)
class PerfPoint:
    """One step on the roofline plot: its arithmetic intensity and achieved FLOP/s, from
    the engine's count of its FLOPs and bytes (StepSample.perf)."""

    step: int
    end_s: float  # when the step ended, on the engine's clock (older points fade)
    intensity: float  # FLOPs per byte moved
    flops_per_s: float  # achieved: the step's FLOPs over its duration
    kind: StepKind
    source: str  # who counted it (StepPerf.source)
    requests: frozenset[str] = frozenset()
    """The requests the step ran (StepSample.work), so the roofline can pick out one chat
    reply's steps; empty for a scrape window. A set, built once per step (~4 µs at 256
    requests): the panel asks every point for one request on each redraw, which over a
    tuple of 256 IDs took ~10 ms for 4,096 points, over the set 0.1 ms."""


def step_kind(sample: StepSample) -> StepKind:
    """A step's kind, from its prefill and decode tokens."""
    if sample.prefill_tokens and sample.decode_tokens:
        return "mixed"
    return "prefill" if sample.prefill_tokens else "decode"


def perf_point(sample: StepSample) -> PerfPoint | None:
    """The step's roofline point, or None where the engine did not count it (or it ran
    no time, or moved no byte: no point to place)."""
    perf = sample.perf
    if perf is None or sample.idle or sample.duration_s <= 0 or perf.flops <= 0:
        return None
    intensity = perf.intensity
    if intensity is None:
        return None
    return PerfPoint(
        step=sample.step,
        end_s=sample.started_at + sample.duration_s,
        intensity=intensity,
        flops_per_s=perf.flops / sample.duration_s,
        kind=step_kind(sample),
        source=perf.source,
        requests=frozenset(w.request_id for w in sample.work),
    )


class Telemetry:
    """Everything the engine panel draws, kept for the session in bounded buffers."""

    def __init__(
        self,
        *,
        steps: int = 4096,
        itl: int = 8192,
        points: int = 4096,
        host: HostWatch | None = None,
    ) -> None:
        # Plain floats, not the StepSamples themselves: a sample holds a dozen small objects
        # the garbage collector would have to walk through, thousands of times over.
        self.kv_t: deque[float] = deque(maxlen=steps)
        self.kv_pct: deque[float] = deque(maxlen=steps)
        self.preempt_t: deque[float] = deque(maxlen=steps)
        self.latest: StepSample | None = None
        self.requests = RequestTracker()
        self.host = host or HostWatch()
        self.itl_request: str | None = None
        self.itl_ms: deque[float] = deque(maxlen=itl)
        self.points: deque[LatencyPoint] = deque(maxlen=points)
        # The roofline's points: one per step the engine counted (plain values, as above).
        self.perf_points: deque[PerfPoint] = deque(maxlen=steps)
        self.perf_version = 0
        self.perf_agreement = PerfAgreement()
        """vLLM's count of each step held to kvscope's; its model is set once the engine's
        card is known (MainScreen), none until then."""
        self.uncounted = 0
        """Steps (or scrape windows) that ran tokens and whose engine counted no FLOPs: a
        server without --enable-mfu-metrics, a vLLM with it turned off."""
        self.preemptions_total = 0
        self.preemption: Preemption | None = None
        """The latest preemption, explained (preemption.py); kept until the next one."""
        self.preemption_t: float | None = None  # its time on the KV plot's clock
        self._victim_token_at: float | None = None  # the victim's next token, once seen
        self.t0: float | None = None
        self.steps_version = 0
        self.itl_version = 0
        self.points_version = 0
        # Recent prefill steps (tokens, seconds), by length: the send estimate's fit.
        self._prefill = PrefillSteps()
        self.timeline = Timeline(steps=steps)
        # The tracked reply's tokens, by output index, and how it ended.
        self.tokens: list[TokenMark] = []
        self._max_tokens = itl
        self.tracked_finish: RequestFinished | None = None
        self.cursor: int | None = None
        """The token the ITL plot and the timeline point at (None: no cursor shown)."""

    # -- from the engine -------------------------------------------------------------------
    @property
    def running(self) -> StepStarted | None:
        """The step the engine is running now, when it announces steps."""
        return self.requests.running

    def step_started(self, started: StepStarted) -> None:
        self.requests.started(started)
        self.steps_version += 1

    def add_sample(self, sample: StepSample) -> None:
        if self.t0 is None:
            self.t0 = sample.started_at
        t = sample.started_at + sample.duration_s - self.t0
        self.kv_t.append(t)
        self.kv_pct.append(sample.kv_usage * 100.0)
        if sample.preemptions:
            self.preempt_t.append(t)
            # Read before the tracks take the sample in: they forget what the victim held.
            self.preemption = observe(self.latest, sample, self.requests.tracks)
            self.preemption_t = t
            self._victim_token_at = None
        self.latest = sample
        point = perf_point(sample)
        if point is not None:
            self.perf_points.append(point)
            self.perf_version += 1
        elif sample.perf is None and (sample.prefill_tokens or sample.decode_tokens):
            self.uncounted += 1
        self.perf_agreement.observe(sample)
        self.requests.sample(sample)
        self.host.add_sample(sample)
        if sample.prefill_tokens > 0 and sample.duration_s > 0:
            self._prefill.add(sample.prefill_tokens, sample.duration_s)
        self.preemptions_total += sample.preemptions
        self.timeline.sample(sample)
        self._settle_cost()
        self.steps_version += 1

    def add_accepted(self, event: RequestAccepted) -> None:
        self.requests.accepted(event.request_id, event.prompt_tokens, event.submitted_at)
        self.timeline.accepted(event.request_id, event.submitted_at)
        self.steps_version += 1

    def track_request(self, request_id: str) -> None:
        """Make `request_id` the one whose ITL the plot shows."""
        self.itl_request = request_id
        self.itl_ms.clear()
        self.tokens.clear()
        self.tracked_finish = None
        self.cursor = None
        self.itl_version += 1
        self.timeline.version += 1

    def add_token(self, event: TokenEvent) -> None:
        self.requests.token(event.request_id, len(event.token_ids))
        # Index 0's latency is the time to first token, not an inter-token latency.
        if event.request_id == self.itl_request and event.index > 0:
            self.itl_ms.append(event.latency_s * 1000.0)
            self.itl_version += 1
        if event.request_id == self.itl_request:
            self._mark_tokens(event)
        p = self.preemption
        if (
            p is not None
            and self._victim_token_at is None
            and event.time_s > p.at
            and any(v.request_id == event.request_id for v in p.victims)
        ):
            self._victim_token_at = event.time_s
            self._victim_id = event.request_id
            self._settle_cost()

    def _settle_cost(self) -> None:
        """Put the preemption's cost on it once the victim's token and the steps up to
        it are both in (they arrive by different paths, in either order)."""
        p, at = self.preemption, self._victim_token_at
        if p is None or at is None or p.cost is not None:
            return
        end = self.timeline.latest_end
        if end is None or end < at - 1e-9:
            return
        cost = cost_of(p, self._victim_id, at, self.timeline)
        if cost is not None:
            self.preemption = p.with_cost(cost)
            self.steps_version += 1

    _victim_id: str = ""

    def _mark_tokens(self, event: TokenEvent) -> None:
        # Tokens that came in one event share its step and time; the first carries the
        # wait. After a preemption the engine may send positions again: the newer wins.
        for k in range(len(event.token_ids)):
            mark = TokenMark(event.step, event.time_s, event.latency_s if k == 0 else 0.0)
            i = event.index + k
            if i < len(self.tokens):
                self.tokens[i] = mark
            elif i == len(self.tokens) and i < self._max_tokens:
                self.tokens.append(mark)
        self.timeline.version += 1

    def add_finished(self, event: RequestFinished) -> LatencyPoint:
        track = self.requests.finished(event.request_id)
        point = latency_point(event, track, host_busy=self.host.busy_words())
        # The engine's own clock: the e2e time runs from submission to the last token.
        row = self.timeline.row(event.request_id)
        h = event.handoff
        if row is not None and h is not None:
            servers = (h.prefill_replica, h.decode_replica)
            self.timeline.handed_off(
                event.request_id, servers, h.prefill_s, event.ttft_s, event.e2e_s
            )
        elif row is not None:
            self.timeline.finished(event.request_id, row.submitted + event.e2e_s)
        if event.request_id == self.itl_request:
            self.tracked_finish = event
        if point.ttft_ms is not None:
            self.points.append(point)
            self.points_version += 1
        self.steps_version += 1
        return point

    # -- what the panels read ----------------------------------------------------------------
    def status(self, request_id: str, *, accepted: bool, done: bool = False) -> RequestStatus:
        return self.requests.status(request_id, accepted=accepted, done=done)

    def prefill_steps(self) -> tuple[tuple[int, float], ...]:
        """The recent prefill steps as (prefill tokens, seconds), a few of each length."""
        return self._prefill.pairs()

    def kv_series(
        self, window_s: float = KV_WINDOW_S
    ) -> tuple[list[float], list[float], list[float]]:
        """The last `window_s` of KV usage: (seconds before the latest step, %, preemptions).

        Times run from -window_s to 0 (the latest step), so the plot scrolls like btop's.
        """
        if not self.kv_t:
            return [], [], []
        now = self.kv_t[-1]
        start = now - window_s
        xs: list[float] = []
        ys: list[float] = []
        # From the newest back to the window's left edge: a redraw costs the window's
        # points, not the whole buffer's.
        for t, pct in zip(reversed(self.kv_t), reversed(self.kv_pct), strict=True):
            if t < start:
                # The line enters the window from its left edge, at the value it had then.
                xs.append(-window_s)
                ys.append(pct)
                break
            xs.append(t - now)
            ys.append(pct)
        xs.reverse()
        ys.reverse()
        marks = [t - now for t in self.preempt_t if t >= start]
        return xs, ys, marks

    def clear_plots(self) -> None:
        """Forget the session's plotted history; the engine's state (latest) is kept."""
        self.kv_t.clear()
        self.kv_pct.clear()
        self.preempt_t.clear()
        self.itl_ms.clear()
        self.points.clear()
        self.perf_points.clear()
        self.perf_agreement.clear()
        self.uncounted = 0
        self.host.clear()
        self._prefill.clear()
        self.timeline.clear()
        self.preemptions_total = 0
        self.preemption = None
        self.preemption_t = None
        self.steps_version += 1
        self.itl_version += 1
        self.points_version += 1
        self.perf_version += 1

    # -- the latency anatomy ---------------------------------------------------------------
    def worst_token(self) -> int | None:
        """The tracked reply's token with the longest ITL (index >= 1), None before two."""
        if len(self.tokens) < 2:
            return None
        return max(range(1, len(self.tokens)), key=lambda i: self.tokens[i].latency_s)

    def set_cursor(self, index: int | None) -> None:
        """Point the ITL plot and the timeline at token `index` (clamped), or at nothing."""
        if index is not None:
            index = max(0, min(index, len(self.tokens) - 1)) if self.tokens else None
        if index != self.cursor:
            self.cursor = index
            self.itl_version += 1
            self.timeline.version += 1

    def explain_token(self, index: int) -> str:
        """Why token `index` of the tracked reply took as long as it did, in one line."""
        return explain_token(
            self.tokens,
            index,
            timeline=self.timeline,
            request_id=self.itl_request,
            finish=self.tracked_finish,
            host=self.host,
        )


def latency_point(
    event: RequestFinished, track: RequestTrack | None, *, host_busy: str | None = None
) -> LatencyPoint:
    itl = list(event.itl_s)
    queue_s: float | None = None
    # The engine's own queue time, where it reports one, beats the one seen from the
    # samples, which is only as fine as a step.
    if event.vllm is not None and event.vllm.queue_s is not None:
        queue_s = event.vllm.queue_s + event.vllm.kvscope_queue_s
    elif event.server is not None and event.server.queue_s is not None:
        queue_s = event.server.queue_s
    elif track is not None:
        queue_s = track.queue_s
    queued = track.queued if track is not None else False
    return LatencyPoint(
        request_id=event.request_id,
        prompt_tokens=event.prompt_tokens,
        ttft_ms=event.ttft_s * 1000.0 if event.ttft_s is not None else None,
        median_itl_ms=percentile(itl, 50) * 1000.0 if itl else None,
        queue_ms=queue_s * 1000.0 if queue_s is not None else None,
        queued=queued,
        host_busy=host_busy,
    )
