"""ReplayEngine: a recorded tape, played back through the same Engine protocol.

It imports no vLLM and no torch: a tape replays on any machine.

How it plays. Every record of the tape is an entry with the time it happened on the
recording engine's clock. A driver (`run()`, on the consumer's event loop) walks the
entries in the order they were recorded and hands each over when the replay's own clock
reaches it, at `speed` times real time:
- a StepSample goes to every step listener;
- a user message (or a request no user typed) goes to every send listener as a
  `ReplayedSend`, which is the consumer's cue to call `stream()` for each of its requests,
  as it would for a user who pressed Enter;
- a request's events (accepted, tokens, finished, or the error it raised) go into that
  request's stream, where they wait until the consumer reads them.

Times. Every time in the events is the recorded one, re-based so that the tape's first
entry is at `origin`, the replay clock's `now()` when playing began. Durations (TTFT, ITL,
a step's length) are the recorded values, whatever the speed: at 4x a reply arrives four
times faster, but its latencies read as they did live. With a VirtualClock the replay
takes no real time at all.

Position. `position` counts the StepSamples handed over (0 to `length`); `seek(n)` hands
over, at once, everything up to the n-th and holds there if paused. Going back rewinds:
rewind listeners are told first (a UI clears its panels), every open stream ends with
ReplayRewound, and the tape plays again from its start to the n-th step, at once.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.clock import Clock, RealClock
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    ProgressCallback,
    RequestAccepted,
    RequestFinished,
    StepListener,
    StepSample,
    TokenEvent,
    UserMessage,
)
from engine.features import EngineFeatures, recorded_features
from engine.listeners import StepListeners
from engine.request_book import Item, LiveRequest, RequestBook, RequestTimes
from engine.tape.errors import RecordingCutOff, ReplayOnly, ReplayRewound, TapeHasNoSession
from engine.tape.format import Abandoned, NewChat, RecordedFailure, StartedRequest
from engine.tape.reader import RecordedRequest, Tape, read_tape

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class ReplayedSend:
    """A send of the recorded session: call `stream()` for each request, as live.

    `message` is what the user typed (None for requests no user typed: a sweep, a script);
    `requests` are the requests it started (one per copy), in the order they were sent.
    """

    message: UserMessage | None
    requests: tuple[GenerationRequest, ...]
    recorded: tuple[RecordedRequest, ...]  # what the tape holds for each, whole


@dataclass(frozen=True, slots=True)
class ReplayPosition:
    """Where the replay is, for a position bar."""

    position: int  # StepSamples handed over so far (0..length)
    length: int  # StepSamples on the tape
    step: int  # the engine's own number of the last one handed over (0 before any)
    time_s: float  # tape time played, from the tape's first entry
    duration_s: float  # tape time from the first entry to the last
    paused: bool
    ended: bool
    speed: float


SendListener = Callable[[ReplayedSend], None]
PositionListener = Callable[[ReplayPosition], None]


@dataclass(eq=False)
class _Channel(LiveRequest):
    """One recorded request's stream: events wait here until its consumer reads them. Its
    times are the recorded ones, not re-based: only durations are made of them."""

    claimed: bool = False
    prompt_tokens: int = 0  # as accepted (0 until then)

    @classmethod
    def of(cls, request: GenerationRequest) -> _Channel:
        # Submitted when the tape says: 0.0 until its RequestAccepted is handed over.
        return cls(request, RequestTimes(request.request_id, 0.0))


class ReplayEngine:
    """The Engine protocol, played from a tape.

    Args:
        tape: a tape's path (read by `start()`) or a `Tape` already read.
        speed: playing speed, 1.0 = as recorded; settable while playing.
        clock: the replay's clock (VirtualClock: as fast as the consumer reads).
        paused: begin paused (`resume()`, `step_once()` or `seek()` then move it).
        max_gap_s: play an idle stretch (the user thinking) in at most this many seconds
            of tape time; the events' times keep the recorded gap.
    """

    def __init__(
        self,
        tape: str | Path | Tape,
        *,
        speed: float = 1.0,
        clock: Clock | None = None,
        paused: bool = False,
        max_gap_s: float | None = None,
    ) -> None:
        self._source = tape
        self.tape: Tape | None = tape if isinstance(tape, Tape) else None
        self.clock: Clock = clock or RealClock()
        self._speed = speed
        self._paused = paused
        self.max_gap_s = max_gap_s
        self._steps = StepListeners()
        self._send_listeners: list[SendListener] = []
        self._rewind_listeners: list[Callable[[int], None]] = []
        self._new_chat_listeners: list[Callable[[], None]] = []
        self._position_listeners: list[PositionListener] = []
        self._pace: list[float] = []
        self._step_entries: list[int] = []  # entry index of every StepSample
        self._sends: dict[int, tuple[int, ...]] = {}  # message entry -> its request indices
        self._channels: dict[int, _Channel] = {}  # request index -> its stream
        self._book: RequestBook[_Channel] = RequestBook()  # open streams, for duplicate IDs
        self._index = 0  # next entry to hand over
        self._position = 0
        self._last_step = 0
        self._origin: float | None = None
        self._offset = 0.0
        self._cursor = 0.0  # tape time at the anchor
        self._anchor = 0.0  # clock time when the cursor was set
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopped = False
        self._ended = False
        if self.tape is not None:
            self._prepare(self.tape)

    # -- the protocol ------------------------------------------------------------------------
    @property
    def card(self) -> ModelCard | None:
        return self.tape.card if self.tape is not None else None

    @property
    def features(self) -> EngineFeatures:
        # Before the tape is read there are no steps to judge: as a tape without a card.
        exact = self.tape.exact_steps if self.tape is not None else True
        return recorded_features(exact, clock=self.clock, replay=self)

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Read the tape (when given a path); raises a TapeError in plain words."""
        if self.tape is None:
            if progress:
                progress(LoadProgress("reading the tape", 0.1))
            source = self._source
            assert not isinstance(source, Tape)
            self.tape = read_tape(source)
            self._prepare(self.tape)
        if progress:
            progress(LoadProgress("ready", 1.0))
        card = self.tape.card
        if card is None:
            raise TapeHasNoSession(self.tape.path)
        self._stopped = False
        return card

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self._steps.add(listener)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """The recorded events of `request`, as the replay reaches them.

        Only requests the replay has handed to send listeners can be streamed: a replay
        takes no new requests (it raises ReplayOnly). A second stream of an ID whose
        request has not ended raises DuplicateRequestId, as on a live engine.
        """
        rid = request.request_id
        async for event in self._book.stream(rid, lambda: self._claim(rid), self.abort):
            yield event

    def abort(self, request_id: str) -> None:
        """Nothing to stop: each request ends as it ended on the tape."""

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        raise ReplayOnly("tokenize a new message")

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        raise ReplayOnly("build a new prompt")

    def shutdown(self) -> None:
        """Stop playing; safe from any thread (the app shuts engines down from a worker)."""
        self._stopped = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                # asyncio.Event is not thread-safe: wake the player on its own loop.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._poke)
                return
        self._poke()

    # -- listeners beyond the protocol -------------------------------------------------------
    def add_send_listener(self, listener: SendListener) -> Callable[[], None]:
        """Call `listener` with every ReplayedSend, on the loop `run()` runs on."""
        return _add(self._send_listeners, listener)

    def add_rewind_listener(self, listener: Callable[[int], None]) -> Callable[[], None]:
        """Called with the target position before a seek backwards replays from the start."""
        return _add(self._rewind_listeners, listener)

    def add_new_chat_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Called where the user started a new chat."""
        return _add(self._new_chat_listeners, listener)

    def add_position_listener(self, listener: PositionListener) -> Callable[[], None]:
        """Called with the position after every step, pause, resume, seek, and at the end."""
        return _add(self._position_listeners, listener)

    # -- playing -----------------------------------------------------------------------------
    @property
    def position(self) -> int:
        return self._position

    @property
    def length(self) -> int:
        return len(self._step_entries)

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        if value <= 0:
            raise ValueError(f"a replay's speed must be above 0, not {value}")
        self._reanchor()
        self._speed = value
        self._poke()

    @property
    def offset(self) -> float:
        """What the replay adds to a recorded time: `origin - (the tape's first time)`."""
        return self._offset

    def snapshot(self) -> ReplayPosition:
        first = self._pace[0] if self._pace else 0.0
        played = self._pace[self._index - 1] - first if self._index else 0.0
        return ReplayPosition(
            position=self._position,
            length=self.length,
            step=self._last_step,
            time_s=played,
            duration_s=(self._pace[-1] - first) if self._pace else 0.0,
            paused=self._paused,
            ended=self._ended,
            speed=self._speed,
        )

    def pause(self) -> None:
        if not self._paused:
            self._reanchor()
            self._paused = True
            self._poke()
            self._changed()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._anchor = self.clock.now()
            self._poke()
            self._changed()

    def toggle_pause(self) -> None:
        self.resume() if self._paused else self.pause()

    def step_once(self) -> int:
        """Hand over the next step (and what came with it); returns the new position."""
        return self.seek(self._position + 1)

    def seek(self, position: int) -> int:
        """Show the replay as it was after its `position`-th step; returns where it is.

        Forward, it hands over everything in between at once; backward, it rewinds (see
        the module's docstring). Playing or paused stays as it was.
        """
        tape = self._require_tape()
        target = max(0, min(position, self.length))
        if target < self._position or (target == 0 and self._index > 0):
            self._rewind(target)
        if target > 0:
            # Everything up to the next step: the step's own tokens come after it on the
            # tape, and a finish or the end record a few microseconds later still.
            stop = self._step_entries[target] if target < self.length else len(tape.entries)
            self._play_until(stop)
        if self._index >= len(self._pace):
            self._reached_end()
        self._cursor = self._pace[self._index - 1] if self._index else self._first_time()
        self._anchor = self.clock.now()
        self._poke()
        self._changed()
        return self._position

    async def run(self, *, hold_at_end: bool = False) -> None:
        """Play the tape on this event loop until its end (or `shutdown()`).

        With `hold_at_end` it then waits, so a seek backwards plays on again; a UI runs it
        as a worker that way. Pause, seek and speed may be changed while it runs.
        """
        tape = self._require_tape()
        if tape.card is None:
            raise TapeHasNoSession(tape.path)
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._ensure_origin()
        self._anchor = self.clock.now()
        if self._index == 0:
            self._cursor = self._first_time()
        while not self._stopped:
            if self._index >= len(self._pace):
                if not self._ended:
                    self._reached_end()
                    self._changed()
                if not hold_at_end:
                    return
                await self._wait()
                continue
            if self._paused:
                await self._wait()
                continue
            due = self._pace[self._index]
            ahead = due - self._tape_now()
            if self.max_gap_s is not None and ahead > self.max_gap_s:
                self._cursor += ahead - self.max_gap_s
                ahead = self.max_gap_s
            if ahead > 0:
                if await self._sleep(ahead / self._speed):
                    continue  # paused, sought, sped up or shut down: look again
                self._cursor, self._anchor = due, self.clock.now()
            stop = bisect.bisect_right(self._pace, max(due, self._tape_now()), self._index)
            self._play_until(stop)
            self._changed()
            # Let consumers read what was handed over, even when no time passes.
            await asyncio.sleep(0)

    # -- internals ---------------------------------------------------------------------------
    def _require_tape(self) -> Tape:
        if self.tape is None:
            raise TapeHasNoSession(str(self._source))
        return self.tape

    def _prepare(self, tape: Tape) -> None:
        pace: list[float] = []
        latest = float("-inf")
        steps: list[int] = []
        sends: dict[int, tuple[int, ...]] = {}
        message_entry: dict[int, int] = {}  # id(message) -> its entry
        for i, entry in enumerate(tape.entries):
            # Entries play in the order they were recorded; a time that runs backwards
            # (an engine's idle sample stamped early) waits for nothing.
            latest = max(latest, entry.at)
            pace.append(latest)
            if isinstance(entry.value, StepSample):
                steps.append(i)
            elif isinstance(entry.value, UserMessage):
                message_entry[id(entry.value)] = i
                sends[i] = ()
        for r_index, request in enumerate(tape.requests):
            if request.message is not None and id(request.message) in message_entry:
                at = message_entry[id(request.message)]
                sends[at] = (*sends[at], r_index)
        self._pace = pace
        self._step_entries = steps
        self._sends = sends

    def _first_time(self) -> float:
        return self._pace[0] if self._pace else 0.0

    def _ensure_origin(self) -> None:
        if self._origin is None:
            self._origin = self.clock.now()
            self._offset = self._origin - self._first_time()

    def _tape_now(self) -> float:
        if self._paused:
            return self._cursor
        return self._cursor + (self.clock.now() - self._anchor) * self._speed

    def _reanchor(self) -> None:
        self._cursor = self._tape_now()
        self._anchor = self.clock.now()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _wait(self) -> None:
        assert self._wake is not None
        await self._wake.wait()
        self._wake.clear()

    async def _sleep(self, seconds: float) -> bool:
        """Sleep on the replay clock; True when woken early (pause, seek, speed, stop)."""
        assert self._wake is not None
        if self._wake.is_set():
            self._wake.clear()
            return True
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when run() itself is cancelled: no task may outlive it.
            sleeper.cancel()
            waker.cancel()
        woke = waker in done
        if woke:
            self._wake.clear()
            self._reanchor()
        return woke

    def _changed(self) -> None:
        if not self._position_listeners:
            return
        snapshot = self.snapshot()
        for listener in list(self._position_listeners):
            listener(snapshot)

    def _rewind(self, target: int) -> None:
        for listener in list(self._rewind_listeners):
            listener(target)
        for channel in self._channels.values():
            channel.put(ReplayRewound(target))
        self._channels.clear()
        self._index = 0
        self._position = 0
        self._last_step = 0
        self._ended = False

    def _claim(self, request_id: str) -> _Channel:
        # The newest unclaimed stream of that ID: an ID may come back after a restart.
        for _, channel in sorted(self._channels.items(), reverse=True):
            if channel.request.request_id == request_id and not channel.claimed:
                channel.claimed = True
                return channel
        raise ReplayOnly(f"take a new request ({request_id!r} is not next on the tape)")

    def _channel(self, r_index: int) -> _Channel:
        channel = self._channels.get(r_index)
        if channel is None:
            assert self.tape is not None
            channel = self._channels[r_index] = _Channel.of(self.tape.requests[r_index].request)
        return channel

    def _play_until(self, stop: int) -> None:
        tape = self.tape
        assert tape is not None
        self._ensure_origin()
        while self._index < stop:
            i = self._index
            self._index += 1
            entry = tape.entries[i]
            self._hand_over(i, entry.value, entry.request)

    def _hand_over(self, i: int, value: object, r_index: int) -> None:
        tape = self.tape
        assert tape is not None
        shift = self._offset
        if isinstance(value, StepSample):
            self._position += 1
            self._last_step = value.step
            self._steps.emit(dataclasses.replace(value, started_at=value.started_at + shift))
        elif isinstance(value, TokenEvent):
            channel = self._channel(r_index)
            # Tokens sent again after a preemption take their place anew, as live.
            channel.times.token_times[value.index :] = [value.time_s] * len(value.token_ids)
            channel.put(dataclasses.replace(value, time_s=value.time_s + shift))
        elif isinstance(value, RequestAccepted):
            channel = self._channel(r_index)
            channel.times.submitted_at = value.submitted_at
            channel.prompt_tokens = value.prompt_tokens
            channel.put(dataclasses.replace(value, submitted_at=value.submitted_at + shift))
        elif isinstance(value, RequestFinished):
            self._end(r_index, value)  # durations only: nothing to move
        elif isinstance(value, RecordedFailure):
            self._end(r_index, value.error)
        elif isinstance(value, Abandoned):
            # Live, the consumer stopped listening here; a replay's consumer still gets
            # an end, the abort the engine made of it.
            channel = self._channel(r_index)
            times = channel.times
            times.submitted_at = times.submitted_at or value.time_s  # never accepted
            self._end(
                r_index,
                times.finished("abort", value.time_s, prompt_tokens=channel.prompt_tokens),
            )
        elif isinstance(value, UserMessage):
            indices = self._sends.get(i, ())
            for r in indices:
                self._channel(r)
            self._send(dataclasses.replace(value, time_s=value.time_s + shift), indices)
        elif isinstance(value, StartedRequest):
            if tape.requests[r_index].message is None or r_index not in self._channels:
                self._channel(r_index)
                self._send(None, (r_index,))
        elif isinstance(value, NewChat):
            for listener in list(self._new_chat_listeners):
                listener()

    def _end(self, r_index: int, item: Item) -> None:
        self._channel(r_index).put(item)

    def _reached_end(self) -> None:
        """The tape is over: a stream it leaves open (a crash mid-reply) ends, said so."""
        if self._ended:
            return
        self._ended = True
        for channel in self._channels.values():
            if not channel.done:
                channel.put(RecordingCutOff(channel.request_id, channel.times.tokens))

    def _send(self, message: UserMessage | None, indices: tuple[int, ...]) -> None:
        tape = self.tape
        assert tape is not None
        recorded = tuple(tape.requests[r] for r in indices)
        send = ReplayedSend(message, tuple(r.request for r in recorded), recorded)
        for listener in list(self._send_listeners):
            listener(send)


def _add(listeners: list[Callable[..., None]], listener: Callable[..., None]) -> Callable[[], None]:
    listeners.append(listener)

    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)

    return remove


__all__ = ["PositionListener", "ReplayEngine", "ReplayPosition", "ReplayedSend", "SendListener"]
