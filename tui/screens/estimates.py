"""How long a send will take to prefill, said before the user waits for it.

Filling an emulated L4's pool means prefilling some 80,000 tokens: minutes on a CPU. The
estimate comes from the prefill rate measured in this session's own steps; before there
is one, from this CPU's calibrated roofline (a floor, so "at least").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.errors import KvscopeError
from tui import format as fmt

if TYPE_CHECKING:
    from engine.events import ModelCard

LONG_SEND_S = 10.0
"""A send whose prefill is estimated to take longer than this is announced first."""

FloorFn = Callable[[int], float]
"""Seconds the roofline says a prompt of N tokens takes to prefill, at best."""


@dataclass(frozen=True)
class PrefillEstimate:
    tokens: int
    seconds: float
    source: Literal["measured", "roofline"]
    device: str
    rate: float | None = None
    """Prompt tokens per second the estimate divides by: measured, or the roofline's."""

    @property
    def long(self) -> bool:
        return self.seconds >= LONG_SEND_S

    def words(self) -> str:
        where = "this CPU" if self.device == "cpu" else f"this {self.device}"
        about = "≈" if self.source == "measured" else "≥"
        head = f"{self.tokens:,} prompt tokens {about} {fmt.duration(self.seconds)} on {where}"
        return f"{head} ({self.basis()})"

    def basis(self) -> str:
        """What the figure rests on, in words."""
        rate = f"{self.rate:,.0f} tokens/s" if self.rate else ""
        if self.source == "measured":
            return f"at the {rate} prefill measured this session" if rate else "measured"
        floor = f"the roofline floor, {rate}" if rate else "the roofline floor"
        return f"{floor}: no prefill measured yet"


def roofline_floor(card: ModelCard) -> FloorFn | None:
    """The CPU's prefill floor for the card's model, if the CPU was calibrated already.

    Never calibrates here (that takes seconds of full CPU): only a cached profile is used.
    """
    if card.device != "cpu":
        return None
    try:
        from roofline.cpu_calibration import load_cached_cpu_profile
        from roofline.floors import ttft_floor_s
        from roofline.hardware import load_geometry

        profile = load_cached_cpu_profile()
        if profile is None:
            return None
        geometry = load_geometry(card.path)
    except (KvscopeError, OSError, ValueError, KeyError):
        return None

    def floor(tokens: int) -> float:
        return ttft_floor_s(geometry, profile, tokens)

    return floor


def estimate(
    card: ModelCard,
    prompt_tokens: int,
    copies: int,
    *,
    measured_rate: float | None,
    floor: FloorFn | None,
) -> PrefillEstimate | None:
    """The prefill time of `copies` prompts of `prompt_tokens`, or None if unknown."""
    total = max(0, prompt_tokens) * max(1, copies)
    if total == 0:
        return None
    if measured_rate is not None and measured_rate > 0:
        return PrefillEstimate(
            total, total / measured_rate, "measured", card.device, rate=measured_rate
        )
    if floor is not None:
        try:
            seconds = floor(prompt_tokens) * max(1, copies)
        except (KvscopeError, ValueError):
            return None
        rate = total / seconds if seconds > 0 else None
        return PrefillEstimate(total, seconds, "roofline", card.device, rate=rate)
    return None
