"""Number formatting shared by the panels, so every number reads the same everywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from engine import byte_size

if TYPE_CHECKING:
    from engine.events import EngineState

StatePlace = Literal["refusal", "card", "panel"]

# The one place an engine state becomes words, for each place that shows it.
_STATE_WORDS: dict[StatePlace, dict[EngineState, str]] = {
    "refusal": {
        "loading": "The engine is still loading; your message is kept.",
        "ready": "",
        "failed": "The engine is not running: ctrl+r tries to start it again.",
        "dead": "The engine stopped: ctrl+r restarts it.",
    },
    "card": {
        "loading": "loading…",
        "ready": "loading…",
        "failed": "no model: the engine did not start",
        "dead": "no model: the engine stopped",
    },
    "panel": {
        "loading": "Engine loading… the plots start with the first step.",
        "ready": "",
        "failed": "The engine did not start (see the chat pane).",
        "dead": "The engine stopped (see the chat pane).",
    },
}


def state_words(state: EngineState, place: StatePlace) -> str:
    """What `place` says about an engine in `state`."""
    return _STATE_WORDS[place][state]


def tokens(n: int) -> str:
    """1,536 (thousands separated, as the errors print them)."""
    return f"{n:,}"


def count(n: int, singular: str, plural: str | None = None) -> str:
    """ "1 block", "2 blocks", "1,536 tokens": the noun agrees with the number."""
    word = singular if n == 1 else (plural if plural is not None else singular + "s")
    return f"{n:,} {word}"


def percent(share: float | None) -> str:
    """A share (0..1) as a whole percentage, "73%"; a dash when it is not known yet."""
    return "–" if share is None else f"{share:.0%}"


def waiting(by_reason: tuple[tuple[str, int], ...], total: int) -> str:
    """Requests waiting, and why where the server says so: "7 (7 capacity)"."""
    reasons = ", ".join(f"{n} {why}" for why, n in by_reason if n)
    return f"{total}" + (f" ({reasons})" if reasons else "")


def duration(seconds: float) -> str:
    """A wait in words a person reads at a glance: "40 s", "3 min", "1 h 5 min"."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def ms(seconds: float | None) -> str:
    """A duration in milliseconds, with the precision a reader can use."""
    if seconds is None:
        return "–"
    value = seconds * 1000.0
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def size(num_bytes: float) -> str:
    """Bytes in the largest binary unit they reach: "512 B", "23.0 KiB", "1.5 GiB". The
    engine's sentences format bytes with the same module, so a panel and an error agree."""
    return byte_size.in_largest_unit(num_bytes)
