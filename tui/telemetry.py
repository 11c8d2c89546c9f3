"""Ring buffers of what the engine did, filled by message handlers, read by a redraw timer.

Handlers only append here (cheap, once per event); the plots and the block map read these
buffers at most ~15 times a second, and only when a `*_version` counter moved. That keeps
the cost of drawing bounded however fast tokens and steps arrive.

Every panel reads `latest`, the one newest StepSample: the status line, the block map and
the KV plot's "now" all describe the same step. The engines send a last idle sample when
their last request ends or is aborted, so an idle engine is shown as idle everywhere.

The latency anatomy lives here too: a `Timeline` of what every request did in every step
(queued, prefill chunk, decode, preempted), the recent steps' per-request work, and the
tracked reply's tokens with the step that made each, from which `explain_token` names why
one token waited.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from engine.stats import percentile
from tui import format as fmt
from tui.request_status import RequestStatus, RequestTrack, RequestTracker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from engine.events import RequestAccepted, RequestFinished, StepSample, TokenEvent, TtftAnatomy

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

    @property
    def service_ttft_ms(self) -> float | None:
        """TTFT with the queue time split off (the prefill's own cost), where known."""
        if self.ttft_ms is None:
            return None
        if self.queued and self.queue_ms is not None:
            return max(0.0, self.ttft_ms - self.queue_ms)
        return self.ttft_ms


@dataclass(frozen=True)
class HostWarning:
    """Why timings on this host are not to be trusted right now, in words."""

    words: str


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


class HostWatch:
    """Says when the host is busy: load above the cores, or step times varying wildly.

    On a shared CPU one decode step can take 23 ms and the next over a second; the user
    should be told why rather than left to read it as the engine's behaviour.
    """

    def __init__(
        self,
        *,
        load_average: Callable[[], float | None] = _load_average,
        cores: int | None = None,
        spread_limit: float = 3.0,
    ) -> None:
        self.load_average = load_average
        self.cores = cores or os.cpu_count() or 1
        self.spread_limit = spread_limit
        self.check_load = False  # on for a CPU engine (the app sets it from the card)
        self._decode_steps: deque[tuple[int, float]] = deque(maxlen=64)

    def add_sample(self, sample: StepSample) -> None:
        if sample.prefill_tokens == 0 and sample.decode_tokens > 0 and sample.duration_s > 0:
            self._decode_steps.append((sample.decode_tokens, sample.duration_s))

    def clear(self) -> None:
        self._decode_steps.clear()

    def step_spread(self) -> float | None:
        """p90 / p50 of recent decode-only steps of the most common batch size."""
        if len(self._decode_steps) < 12:
            return None
        batch, _ = Counter(n for n, _ in self._decode_steps).most_common(1)[0]
        times = [d for n, d in self._decode_steps if n == batch]
        if len(times) < 12:
            return None
        mid = percentile(times, 50)
        return percentile(times, 90) / mid if mid > 0 else None

    def warning(self) -> HostWarning | None:
        parts: list[str] = []
        if self.check_load:
            load = self.load_average()
            if load is not None and load > self.cores:
                parts.append(f"load {load:.1f} on {self.cores} cores")
        spread = self.step_spread()
        if spread is not None and spread > self.spread_limit:
            parts.append(f"decode steps vary ×{spread:.1f}")
        if not parts:
            return None
        return HostWarning(f"⚠ host busy: {'; '.join(parts)}: timings are noisy")


SegmentKind = Literal["queued", "prefill", "decode", "preempted"]
"""What a request was doing over a stretch of engine time (one colour of the timeline)."""


class StepRecord(NamedTuple):
    """One step's per-request work, kept as plain tuples (which the GC stops tracking)."""

    step: int
    start: float
    end: float
    work: tuple[tuple[str, int, int], ...]  # (request_id, prefill tokens, decode tokens)
    preempted: tuple[str, ...]

    @property
    def duration_s(self) -> float:
        return self.end - self.start


class Segment(NamedTuple):
    start: float
    end: float
    kind: SegmentKind


class TokenMark(NamedTuple):
    """One token of the tracked reply: the step that made it, when, and how long it took."""

    step: int
    time_s: float
    latency_s: float


class TimelineRow:
    """One request's row: its segments, merged while the kind stays the same."""

    __slots__ = (
        "cursor",
        "end",
        "preempted",
        "request_id",
        "scheduled",
        "seen",
        "segments",
        "submitted",
    )

    def __init__(self, request_id: str, submitted: float, segments: int) -> None:
        self.request_id = request_id
        self.submitted = submitted
        self.segments: deque[Segment] = deque(maxlen=segments)
        self.cursor = submitted  # engine time up to which the row is drawn
        self.end: float | None = None  # set when the request is over
        self.seen = False  # a step sample has shown it (the engine has it)
        self.scheduled = False  # some step ran it
        self.preempted = False  # preempted, and not yet decoding again

    @property
    def start(self) -> float:
        return self.segments[0].start if self.segments else self.cursor

    def book(self, until: float, kind: SegmentKind) -> None:
        """Extend the row to `until` as `kind` (no-op for time already drawn)."""
        if until <= self.cursor:
            return
        last = self.segments[-1] if self.segments else None
        if last is not None and last.kind == kind and last.end >= self.cursor:
            self.segments[-1] = Segment(last.start, until, kind)
        else:
            self.segments.append(Segment(self.cursor, until, kind))
        self.cursor = until


class Timeline:
    """What every request of the session did, step by step, in bounded buffers.

    Rows come from the accepted events and, for requests the samples show first (a sweep
    on the same engine, or an accepted event still on its way), from the samples. A row
    ends with its request's finish, or when a sample no longer lists a request it listed
    before (aborted by a new chat, whose finish nobody receives).
    """

    def __init__(self, *, rows: int = 256, steps: int = 4096, segments: int = 512) -> None:
        self.rows: deque[TimelineRow] = deque(maxlen=rows)
        self.steps: deque[StepRecord] = deque(maxlen=steps)
        self._segments = segments
        self._live: dict[str, TimelineRow] = {}
        self._by_id: dict[str, TimelineRow] = {}
        self.latest_end: float | None = None
        self.per_request: bool | None = None
        """Whether the samples say what each request did (None until a step with tokens):
        False for a remote server, whose samples are /metrics scrapes."""
        self.version = 0

    def _row(self, request_id: str, submitted: float) -> TimelineRow:
        row = TimelineRow(request_id, submitted, self._segments)
        if len(self.rows) == self.rows.maxlen:
            old = self.rows[0]
            self._live.pop(old.request_id, None)
            self._by_id.pop(old.request_id, None)
        self.rows.append(row)
        self._live[request_id] = row
        self._by_id[request_id] = row
        return row

    def row(self, request_id: str) -> TimelineRow | None:
        return self._by_id.get(request_id)

    def accepted(self, request_id: str, submitted_at: float) -> None:
        row = self._by_id.get(request_id)
        if row is None:
            self._row(request_id, submitted_at)
        elif submitted_at < row.start:
            # The sample that first ran it came in before its accepted event: the wait
            # from submission to that step was queueing.
            row.segments.appendleft(Segment(submitted_at, row.start, "queued"))
            row.submitted = submitted_at
        self.version += 1

    def finished(self, request_id: str, end: float) -> None:
        row = self._live.pop(request_id, None)
        if row is not None:
            # The finish may come in before the sample of the step that made its last
            # token: that stretch is more of what the row was doing.
            row.book(end, row.segments[-1].kind if row.segments else "queued")
            row.end = row.cursor
            self.version += 1

    def sample(self, sample: StepSample) -> None:
        if sample.idle:
            # Nothing is live any more: close every row still open (their finish events
            # may still be on their way; `finished` then changes nothing).
            for row in self._live.values():
                row.end = row.cursor
            self._live.clear()
            self.version += 1
            return
        if self.per_request is None and sample.prefill_tokens + sample.decode_tokens > 0:
            self.per_request = bool(sample.work)
        if not self.per_request:
            return
        start = sample.started_at
        end = start + sample.duration_s
        work = {w.request_id: w for w in sample.work}
        self.steps.append(
            StepRecord(
                sample.step,
                start,
                end,
                tuple((w.request_id, w.prefill_tokens, w.decode_tokens) for w in sample.work),
                sample.preempted_ids,
            )
        )
        self.latest_end = end
        waiting = set(sample.waiting_ids)
        preempted = set(sample.preempted_ids)
        present = work.keys() | waiting | preempted | {b.request_id for b in sample.blocks}
        for rid in present:
            if rid not in self._by_id:
                self._row(rid, start)
        for rid, row in list(self._live.items()):
            if rid not in present:
                if row.seen:
                    # Gone without a finish that reached us: over when it was last seen.
                    row.end = row.cursor
                    del self._live[rid]
                    continue
                # Not yet in the engine (kvscope's own queue): queued.
                row.book(end, "queued")
                continue
            row.seen = True
            if rid in preempted:
                row.preempted = True
            w = work.get(rid)
            kind: SegmentKind
            if w is None:
                kind = "preempted" if row.preempted else "queued"
                row.book(end, kind)
                continue
            kind = "prefill" if w.prefill_tokens > 0 else "decode"
            # The time since the last step: still queued before its first step, lost to
            # the preemption after one; between two of its steps, more of the same.
            if not row.scheduled:
                row.book(start, "queued")
            elif row.preempted:
                row.book(start, "preempted")
            else:
                row.book(start, kind)
            row.book(end, kind)
            row.scheduled = True
            if w.decode_tokens > 0:
                row.preempted = False
        self.version += 1

    def step(self, step: int) -> StepRecord | None:
        """The kept record of engine step `step`, or None when it is not (or no longer) kept."""
        i = bisect.bisect_left(self.steps, step, key=lambda r: r.step)
        if i < len(self.steps) and self.steps[i].step == step:
            return self.steps[i]
        return None

    def steps_in(self, after: float, until: float) -> list[StepRecord]:
        """The steps that ended in (after, until]: those a token waited through."""
        out: list[StepRecord] = []
        eps = 1e-9
        for record in reversed(self.steps):
            if record.end <= after + eps:
                break
            if record.end <= until + eps:
                out.append(record)
        out.reverse()
        return out

    def clear(self) -> None:
        """Forget the history; live requests keep a row, drawn from now on."""
        self.steps.clear()
        live = list(self._live.values())
        self.rows.clear()
        self._by_id.clear()
        for row in live:
            row.segments.clear()
            self.rows.append(row)
            self._by_id[row.request_id] = row
        self.version += 1


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
        self.preemptions_total = 0
        self.t0: float | None = None
        self.steps_version = 0
        self.itl_version = 0
        self.points_version = 0
        # Recent prefill steps (tokens, seconds): the measured prefill rate for estimates.
        self._prefill: deque[tuple[int, float]] = deque(maxlen=32)
        self.timeline = Timeline(steps=steps)
        # The tracked reply's tokens, by output index, and how it ended.
        self.tokens: list[TokenMark] = []
        self._max_tokens = itl
        self.tracked_finish: RequestFinished | None = None
        self.cursor: int | None = None
        """The token the ITL plot and the timeline point at (None: no cursor shown)."""

    # -- from the engine -------------------------------------------------------------------
    def add_sample(self, sample: StepSample) -> None:
        if self.t0 is None:
            self.t0 = sample.started_at
        t = sample.started_at + sample.duration_s - self.t0
        self.kv_t.append(t)
        self.kv_pct.append(sample.kv_usage * 100.0)
        if sample.preemptions:
            self.preempt_t.append(t)
        self.latest = sample
        self.requests.sample(sample)
        self.host.add_sample(sample)
        if sample.prefill_tokens > 0 and sample.duration_s > 0:
            self._prefill.append((sample.prefill_tokens, sample.duration_s))
        self.preemptions_total += sample.preemptions
        self.timeline.sample(sample)
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
        point = latency_point(event, track)
        # The engine's own clock: the e2e time runs from submission to the last token.
        row = self.timeline.row(event.request_id)
        if row is not None:
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

    def prefill_rate(self) -> float | None:
        """Prompt tokens per second over the recent prefill steps, None before any."""
        tokens = sum(n for n, _ in self._prefill)
        seconds = sum(s for _, s in self._prefill)
        if tokens < 64 or seconds <= 0:
            return None
        return tokens / seconds

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
        self.host.clear()
        self._prefill.clear()
        self.timeline.clear()
        self.preemptions_total = 0
        self.steps_version += 1
        self.itl_version += 1
        self.points_version += 1

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
        if not 0 <= index < len(self.tokens):
            return "no token there yet"
        mark = self.tokens[index]
        if index == 0:
            return self._explain_first(mark)
        head = f"token {index} waited {fmt.ms(mark.latency_s)}"
        if not self.timeline.per_request:
            return (
                f"{head}: this engine does not show its steps (a remote server), "
                "so the cause cannot be known remotely"
            )
        record = self.timeline.step(mark.step)
        if record is None:
            kept = len(self.timeline.steps)
            return f"{head}: step {mark.step:,} is older than the last {kept:,} steps kept"
        me = self.itl_request
        # Steps after the token's own could not have held it up.
        waited = [
            r
            for r in self.timeline.steps_in(mark.time_s - mark.latency_s, mark.time_s)
            if r.step <= mark.step
        ]
        if record not in waited:
            waited.append(record)
        preempted_at = [r.step for r in waited if me in r.preempted]
        if preempted_at:
            return (
                f"{head}: it was preempted at step {preempted_at[0]:,} and recomputed "
                f"over {fmt.count(len(waited), 'step')} ({waited[0].step:,}–{waited[-1].step:,})"
            )
        prefills = _prefills(waited, me)
        ran_me = [r for r in waited if any(rid == me for rid, _, _ in r.work)]
        if len(waited) > 1 and len(ran_me) < len(waited):
            # Steps went by without it: it waited for its turn, not only for one step.
            skipped = len(waited) - len(ran_me)
            what = f"{fmt.count(skipped, 'step')} ran without it"
            if prefills:
                what += f"; they ran {_prefill_words(prefills)}"
            return f"{head}: {what} (steps {waited[0].step:,}–{waited[-1].step:,})"
        if prefills:
            where = (
                f"step {record.step:,}"
                if len(waited) == 1
                else f"steps {waited[0].step:,}–{waited[-1].step:,}"
            )
            return f"{head}: {where} also ran {_prefill_words(prefills)}"
        decoders = sum(1 for _, _, d in record.work if d > 0)
        took = record.duration_s
        words = (
            f"{head}: step {record.step:,} decoded "
            f"{fmt.count(decoders, 'request')} ({fmt.ms(took)})"
        )
        if took < 0.5 * mark.latency_s:
            words += "; the rest passed between steps, outside the engine"
        return words

    def _explain_first(self, mark: TokenMark) -> str:
        done = self.tracked_finish
        if done is not None and done.anatomy is not None:
            return f"token 0 is the first: {anatomy_words(done.anatomy, done.ttft_s)}"
        return f"token 0 is the first: TTFT {fmt.ms(mark.latency_s)}"


def _prefills(records: list[StepRecord], me: str | None) -> list[tuple[str, int]]:
    """Other requests' prefill tokens over `records`, biggest first."""
    totals: dict[str, int] = {}
    for r in records:
        for rid, p, _ in r.work:
            if rid != me and p > 0:
                totals[rid] = totals.get(rid, 0) + p
    return sorted(totals.items(), key=lambda kv: -kv[1])


def _article(n: int) -> str:
    """ "a" or "an" before a number read aloud: an 8,192-token, an 11-token, a 2,048-token."""
    lead = f"{n:,}".split(",")[0]
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


def _prefill_words(prefills: list[tuple[str, int]]) -> str:
    if len(prefills) == 1:
        rid, n = prefills[0]
        return f"{_article(n)} {n:,}-token prefill chunk of {rid}"
    shown = [f"{rid} ({n:,} tokens)" for rid, n in prefills[:3]]
    more = len(prefills) - len(shown)
    tail = f" and {more:,} more" if more else ""
    listed = ", ".join(shown[:-1]) + " and " + shown[-1] if not more else ", ".join(shown)
    return f"prefill chunks of {listed}{tail}"


def anatomy_parts(anatomy: TtftAnatomy, ttft_s: float | None = None) -> tuple[str, ...]:
    """("TTFT 2.31 s = queue 0.05", "prefill 1.90 (4 chunks)", "others 0.36"): the terms
    of the sum, each in the total's unit and precision, so that they read as one sum."""
    total = ttft_s if ttft_s is not None else anatomy.total_s
    unit, scale, places = ("s", 1.0, 2) if total >= 1.0 else ("ms", 1000.0, 1)
    if unit == "ms" and total >= 0.1:
        places = 0  # as the footer's "TTFT 112 ms"

    def num(value: float) -> str:
        value = max(0.0, value) * scale  # a share computed as a difference can be -1e-18
        return f"{value:,.{places}f}"

    parts = [
        f"TTFT {num(total)} {unit} = queue {num(anatomy.queue_s)}",
        f"prefill {num(anatomy.prefill_s)} ({fmt.count(anatomy.chunks, 'chunk')})",
        f"others {num(anatomy.others_s)}",
    ]
    if anatomy.preempted_s > 0:
        parts.append(f"preempted {num(anatomy.preempted_s)}")
    return tuple(parts)


def anatomy_words(anatomy: TtftAnatomy, ttft_s: float | None = None) -> str:
    """ "TTFT 2.31 s = queue 0.05 + prefill 1.90 (4 chunks) + others 0.36"."""
    return " + ".join(anatomy_parts(anatomy, ttft_s))


def iter_window(steps: deque[StepRecord], start: float, end: float) -> Iterator[StepRecord]:
    """The kept steps that overlap [start, end], newest last."""
    i = bisect.bisect_right(steps, start, key=lambda r: r.end)
    for k in range(i, len(steps)):
        record = steps[k]
        if record.start > end:
            break
        yield record


def latency_point(event: RequestFinished, track: RequestTrack | None) -> LatencyPoint:
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
    )
