"""Timeline: what every request did in every step, the model the request timeline draws.

Each request's row is a run of segments (queued, prefill chunk, decode, preempted), and
the recent steps' per-request work is kept beside them, from which the token explainer
(token_explainer.py) names why one token waited. The widget that draws it is
tui/widgets/request_timeline.py.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.events import StepSample

SegmentKind = Literal["queued", "prefill", "decode", "preempted", "handoff"]
"""What a request was doing over a stretch of engine time (one colour of the timeline);
"handoff" only on a prefill/decode pair's row: its KV moving from one server to the other."""


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
        "servers",
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
        # (prefill server, decode server) of a disaggregated request's row, else None.
        self.servers: tuple[str, str] | None = None

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

    def handed_off(
        self,
        request_id: str,
        servers: tuple[str, str],
        prefill_s: float,
        ttft_s: float | None,
        e2e_s: float,
    ) -> None:
        """A disaggregated request's row, from its finish (engine/fleet/disaggregated.py):
        prefill on the first server, the KV's hand-off, decode on the second. Neither is
        a server that shows its steps, so the client's times draw it."""
        row = self._by_id.get(request_id)
        if row is None:
            return
        self._live.pop(request_id, None)
        row.segments.clear()
        row.cursor = t0 = row.submitted
        row.servers = servers
        row.book(t0 + prefill_s, "prefill")
        if ttft_s is not None:
            row.book(t0 + ttft_s, "handoff")
            row.book(t0 + e2e_s, "decode")
        else:  # no token came from the decode server
            row.book(t0 + e2e_s, "handoff")
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


def iter_window(steps: deque[StepRecord], start: float, end: float) -> Iterator[StepRecord]:
    """The kept steps that overlap [start, end], newest last."""
    i = bisect.bisect_right(steps, start, key=lambda r: r.end)
    for k in range(i, len(steps)):
        record = steps[k]
        if record.start > end:
            break
        yield record
