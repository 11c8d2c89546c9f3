"""Where each live request is, in one vocabulary, derived from the engine's step samples.

The engine does not say why a request waits. The samples say enough to tell it apart:
a request not in any sample's block list after a step ran without it is waiting; it waits
for KV blocks only if fewer blocks are free than it needs, and otherwise on the
scheduler's token budget. A request whose KV covers less than its prompt is prefilling,
one chunk per step; one that has produced tokens is decoding. Every place that shows a
request's state (the reply footer, the copies line, the summary) takes its words from
`RequestStatus.words`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import PrefillChunk, StepSample, StepStarted

Phase = Literal[
    "sending", "submitted", "queued", "waiting_kv", "prefilling", "decoding", "preempted", "done"
]
"""A request's place in its life, as far as the step samples show it."""

PHASE_ORDER: tuple[Phase, ...] = (
    "sending",
    "submitted",
    "queued",
    "waiting_kv",
    "preempted",
    "prefilling",
    "decoding",
    "done",
)


@dataclass(frozen=True)
class RequestStatus:
    phase: Phase
    words: str


# The short words for each phase, used when several copies are counted on one line.
PHASE_WORDS: dict[Phase, str] = {
    "sending": "sending",
    "submitted": "submitted",
    "queued": "queued by the scheduler (token budget)",
    "waiting_kv": "waiting for KV blocks",
    "prefilling": "prefilling",
    "decoding": "decoding",
    "preempted": "preempted",
    "done": "done",
}


@dataclass
class RequestTrack:
    """What the samples have shown about one request since it was submitted."""

    request_id: str
    prompt_tokens: int
    submitted_at: float
    first_scheduled_at: float | None = None
    skipped_steps: int = 0  # steps that ran after its submission without scheduling it
    computed: int = 0  # tokens whose KV it held in the latest sample that listed it
    chunks: int = 0  # prefill steps seen (chunked prefill: one chunk per step)
    last_chunk: int = 0
    in_latest: bool = False
    preemptions: int = 0
    preempted_waiting: bool = False
    lost: int = 0  # tokens whose KV the latest preemption threw away (to be recomputed)
    tokens: int = 0
    running: PrefillChunk | None = None
    """Its prompt chunk in the step running now (from a StepStarted), until the step ends."""
    running_since: float = 0.0

    @property
    def queue_s(self) -> float | None:
        """Time from submission to the first step that scheduled it, when seen."""
        if self.first_scheduled_at is None:
            return None
        return max(0.0, self.first_scheduled_at - self.submitted_at)

    @property
    def queued(self) -> bool:
        """At least one engine step ran after it arrived without taking it in."""
        return self.skipped_steps > 0

    def take(self, sample: StepSample, computed: int | None) -> None:
        """Fold one sample in; `computed` is its KV token count there, None if absent."""
        if sample.started_at < self.submitted_at:
            return  # a step that began before the request existed says nothing about it
        if self.request_id in sample.preempted_ids:
            self.preemptions += 1
            self.preempted_waiting = True
            self.lost = self.computed
            self.computed = 0  # its blocks went back: the prefill starts over
            self.chunks = 0
        if computed is None:
            self.in_latest = False
            if self.first_scheduled_at is None and sample.duration_s > 0:
                self.skipped_steps += 1
            return
        if self.first_scheduled_at is None:
            self.first_scheduled_at = sample.started_at
        self.preempted_waiting = False
        if computed > self.computed and self.computed < self.prompt_tokens:
            self.last_chunk = computed - self.computed
            self.chunks += 1
        self.computed = computed
        self.in_latest = True


def elapsed_words(seconds: float) -> str:
    """A running clock: "0.4 s", "12 s", "2 min 05 s"."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s"


def status_of(
    track: RequestTrack | None,
    latest: StepSample | None,
    *,
    accepted: bool,
    done: bool = False,
    now: float | None = None,
) -> RequestStatus:
    """The one description of where a request is."""
    if done:
        return RequestStatus("done", "done")
    if track is None or not accepted:
        return RequestStatus("sending", "sending")
    if track.running is not None and now is not None:
        c = track.running
        return RequestStatus(
            "prefilling",
            f"prefilling (chunk {c.chunk} of {c.chunks}), "
            f"{elapsed_words(now - track.running_since)}",
        )
    if track.preempted_waiting:
        redo = f", {track.lost:,} tokens to recompute" if track.lost else ""
        return RequestStatus(
            "preempted",
            f"preempted ×{track.preemptions} (KV pool full{redo}): waiting to run again",
        )
    if track.in_latest and track.computed < track.prompt_tokens:
        chunk = max(1, track.last_chunk)
        left = math.ceil((track.prompt_tokens - track.computed) / chunk)
        k = max(1, track.chunks)
        return RequestStatus("prefilling", f"prefilling (chunk {k} of {k + left})")
    if track.tokens or track.in_latest:
        return RequestStatus("decoding", "decoding")
    if track.skipped_steps == 0 or latest is None:
        return RequestStatus("submitted", "submitted: waiting for the next engine step")
    # At least one token: a request needs a block to be scheduled at all, even one whose
    # acceptance reported 0 prompt tokens, so with no block free it waits for KV.
    prompt = max(1, track.prompt_tokens)
    if latest.short_of_kv(prompt):
        return RequestStatus(
            "waiting_kv",
            f"waiting for KV blocks (needs {latest.blocks_for(prompt):,}, "
            f"{latest.free_blocks:,} free)",
        )
    return RequestStatus("queued", PHASE_WORDS["queued"])


@dataclass
class RequestTracker:
    """Every live request's track, fed with acceptances, samples, tokens and finishes.

    Samples and acceptances travel separately (a message and a stream event), so a few
    recent samples are kept to replay to a request accepted after them.
    """

    tracks: dict[str, RequestTrack] = field(default_factory=dict)
    _recent: deque[tuple[StepSample, dict[str, int]]] = field(
        default_factory=lambda: deque(maxlen=64)
    )
    latest: StepSample | None = None
    running: StepStarted | None = None
    """The step running now, when the engine announces steps (cleared when it ends)."""
    now: Callable[[], float] = time.perf_counter
    """The engine's clock, for how long the running step has run."""

    def accepted(self, request_id: str, prompt_tokens: int, submitted_at: float) -> RequestTrack:
        track = RequestTrack(request_id, prompt_tokens, submitted_at)
        self.tracks[request_id] = track
        for sample, held in self._recent:
            track.take(sample, held.get(request_id))
        if self.running is not None:
            self._mark_running(track, self.running)
        return track

    def started(self, started: StepStarted) -> None:
        self.running = started
        for track in self.tracks.values():
            self._mark_running(track, started)

    @staticmethod
    def _mark_running(track: RequestTrack, started: StepStarted) -> None:
        track.running = next((c for c in started.chunks if c.request_id == track.request_id), None)
        track.running_since = started.started_at

    def sample(self, sample: StepSample) -> None:
        self.latest = sample
        if self.running is not None and (sample.idle or sample.step >= self.running.step):
            self.running = None
            for track in self.tracks.values():
                track.running = None
        held = {b.request_id: b.num_tokens for b in sample.blocks}
        self._recent.append((sample, held))
        for rid, track in self.tracks.items():
            track.take(sample, held.get(rid))

    def token(self, request_id: str, count: int) -> None:
        track = self.tracks.get(request_id)
        if track is not None:
            track.tokens += count
            track.preempted_waiting = False

    def finished(self, request_id: str) -> RequestTrack | None:
        return self.tracks.pop(request_id, None)

    def status(self, request_id: str, *, accepted: bool, done: bool = False) -> RequestStatus:
        return status_of(
            self.tracks.get(request_id),
            self.latest,
            accepted=accepted,
            done=done,
            now=self.now() if self.running is not None else None,
        )

    def clear(self) -> None:
        self.tracks.clear()
