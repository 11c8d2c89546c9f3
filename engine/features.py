"""What an engine offers beyond the Engine protocol's core, declared in one typed place.

Every engine answers `features` with an `EngineFeatures`. A panel that needs more than the
core asks it here (`engine.features.remote`), and mypy checks the answer: a missing or
misspelt feature is a type error, never a silently hidden panel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.clock import Clock
    from engine.events import (
        PrefixCacheView,
        RemoteCapabilities,
        ScrapeListener,
        StepStartListener,
        UserMessage,
    )
    from engine.fleet.fleet_state import FleetState
    from engine.memory_budget import MemoryBudget


class RemoteView(Protocol):
    """A running server seen from outside: its scrapes, what it can show, its cache."""

    @property
    def capabilities(self) -> RemoteCapabilities: ...

    def add_scrape_listener(self, listener: ScrapeListener) -> Callable[[], None]:
        """Call `listener` with every /metrics scrape; returns a function that removes it."""
        ...

    def prefix_cache(self) -> PrefixCacheView:
        """The cached blocks the server reported, by hash and chat session."""
        ...

    def new_session(self, session_id: str | None = None) -> str:
        """Start a new chat session: the blocks it caches from now on are coloured by it."""
        ...


class Playback(Protocol):
    """A tape being played: where it stands, and how to move it.

    A Protocol, not engine/replay's ReplayEngine: the replay room imports this module.
    """

    @property
    def position(self) -> int:
        """StepSamples handed over so far (0..length)."""
        ...

    @property
    def length(self) -> int:
        """StepSamples on the tape."""
        ...

    @property
    def paused(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def seek(self, position: int) -> int:
        """Go to `position` (clamped to the tape); returns where it went."""
        ...


class StepStarts(Protocol):
    """An engine that says when a step begins, not only when it ends."""

    def add_step_start_listener(self, listener: StepStartListener) -> Callable[[], None]:
        """Call `listener` with a StepStarted before each step's model run (from the
        engine's own thread); returns a function that removes it."""
        ...


class FleetWatch(Protocol):
    """Several replicas behind the URL the requests go to, each scraped on its own."""

    def fleet_state(self) -> FleetState:
        """Every replica's latest row, and the imbalance line when there is one."""
        ...


class SessionTape(Protocol):
    """A session being recorded: what only the UI knows goes on the tape through this."""

    def record_user_message(
        self,
        text: str,
        *,
        request_ids: tuple[str, ...] | list[str] = (),
        synthetic_tokens: int | None = None,
    ) -> UserMessage:
        """Tape what the user sent; call it before streaming the requests it starts."""
        ...

    def record_new_chat(self) -> None:
        """Tape that the chat started afresh (`--resume` restores only what follows)."""
        ...


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """The optional parts of one engine. None (or False) means the engine has no such part.

    `exact_steps` says what its StepSamples can be trusted for, so that a view says "cannot
    be known remotely" from the engine's word, not from a guess over samples.
    """

    exact_steps: bool
    """A StepSample is one scheduler step, with each request's prefill and decode tokens
    and its physical block IDs (False: a server's /metrics scrape, which has none)."""
    clock: Clock | None = None
    """The clock the engine stamps its events with, when it is not the real one."""
    remote: RemoteView | None = None
    tape: SessionTape | None = None
    replay: Playback | None = None
    """The tape being played: the engine makes no prompts of its own."""
    step_starts: StepStarts | None = None
    """Each step announced as it begins (a server's scrapes and a tape have no such moment)."""
    memory: MemoryBudget | None = None
    """Where the engine's memory went at start-up, by vLLM's own accounting."""
    fleet: FleetWatch | None = None
    """The replicas behind a router (`--replica`), scraped one by one."""

    def with_tape(self, tape: SessionTape) -> EngineFeatures:
        return replace(self, tape=tape)


IN_PROCESS = EngineFeatures(exact_steps=True)
"""An engine that steps in kvscope's own process and sees its scheduler."""

REMOTE_DEVICE_PREFIX = "remote "
"""How a remote engine's card names its device: "remote http://host:port" (and how a tape
from before ModelCard.exact_steps is known to be a server's)."""


def recorded_features(
    exact_steps: bool, *, clock: Clock | None, replay: Playback
) -> EngineFeatures:
    """What a tape's samples can show: what the engine that recorded it could, as its
    card says (`Tape.exact_steps`)."""
    return EngineFeatures(
        exact_steps=exact_steps,
        clock=clock,
        replay=replay,
    )
