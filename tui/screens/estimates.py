"""How long a send will take to prefill, said before the user waits for it.

Filling an emulated L4's pool means prefilling some 80,000 tokens: minutes on a CPU. The
estimate comes from a fixed cost plus a per-token rate fitted to this session's own
prefill steps (one length alone gives a rough range: it cannot tell the two apart);
before any, from this CPU's calibrated roofline (a floor, so "at least").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.errors import KvscopeError
from engine.request_book import prompt_fits
from tui import format as fmt
from tui.telemetry.prefill_fit import fit_prefill

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
    """The estimate; for a rough one, the upper end of its range."""
    source: Literal["measured", "rough", "roofline"]
    device: str
    rate: float | None = None
    """Prompt tokens per second: the fitted rate past the fixed cost, or the roofline's."""
    fixed_s: float | None = None
    """The fitted fixed cost of a prefill step (measured only)."""
    steps: int = 0
    """How many measured prefill steps the estimate rests on."""
    low_s: float | None = None
    """A rough estimate's lower end: one length measured cannot tell its fixed cost from
    its rate, so a longer prompt takes between all-fixed and all-rate."""
    measured: tuple[int, float] | None = None
    """A rough estimate's one measured length and its time, or the exact length matched."""

    @property
    def long(self) -> bool:
        return self.seconds >= LONG_SEND_S

    def words(self) -> str:
        where = "this CPU" if self.device == "cpu" else f"this {self.device}"
        if self.source == "rough" and self.low_s is not None:
            low, high = fmt.duration(self.low_s), fmt.duration(self.seconds)
            span = f"≈ {high}" if low == high else f"{low} to {high}"
            return f"{self.tokens:,} prompt tokens: {span} on {where} ({self.basis()})"
        about = "≥" if self.source == "roofline" else "≈"
        head = f"{self.tokens:,} prompt tokens {about} {fmt.duration(self.seconds)} on {where}"
        return f"{head} ({self.basis()})"

    def basis(self) -> str:
        """What the figure rests on, in words."""
        rate = f"{self.rate:,.0f} tokens/s" if self.rate else ""
        if self.source == "measured" and self.fixed_s is not None and rate:
            steps = fmt.count(self.steps, "prefill step")
            # Under half a millisecond the fixed cost is none the reader could use.
            fixed = f"a fixed {_span(self.fixed_s)} + " if self.fixed_s >= 5e-4 else ""
            return f"{fixed}{rate}, fitted to {steps} this session"
        if self.source == "measured" and self.measured is not None:
            n, took = self.measured
            return f"a {n:,}-token prefill took {_span(took)} this session"
        if self.source == "rough" and self.measured is not None:
            n, took = self.measured
            return (
                f"rough: only {n:,}-token prefills measured, {_span(took)} each; "
                "a second length tells the fixed cost from the rate"
            )
        floor = f"the roofline floor, {rate}" if rate else "the roofline floor"
        return f"{floor}: no prefill measured yet"


def _span(seconds: float) -> str:
    """A measured time at the precision it was measured: "40 ms", "2.3 s", "1 min"."""
    if seconds < 1:
        return fmt.ms(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    return fmt.duration(seconds)


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
    measured: Sequence[tuple[int, float]],
    floor: FloorFn | None,
) -> PrefillEstimate | None:
    """The prefill time of `copies` prompts of `prompt_tokens`, or None if unknown.

    `measured` are this session's prefill steps (tokens, seconds). With two lengths or
    more, a fixed cost plus a per-token rate is fitted to them (prefill_fit.py) and the
    copies' tokens cost one fixed cost and the rate; with one length, a rough range is
    given. None for a prompt the engine will refuse (at or past max_model_len): the
    slider says so, and no time is to be waited for it.
    """
    if not prompt_fits(prompt_tokens, card.max_model_len):
        return None
    total = max(0, prompt_tokens) * max(1, copies)
    if total == 0:
        return None
    least: float | None = None
    if floor is not None:
        try:
            least = floor(prompt_tokens) * max(1, copies)
        except (KvscopeError, ValueError):
            least = None
    fit = fit_prefill(measured)
    if fit is not None:
        seconds = max(fit.seconds(total), least or 0.0)
        return PrefillEstimate(
            total,
            seconds,
            "measured",
            card.device,
            rate=fit.rate,
            fixed_s=fit.fixed_s,
            steps=fit.steps,
        )
    lengths = sorted({n for n, _ in measured if n > 0})
    if lengths:
        # One length (or no rate to be read): its own time, at the median of its steps.
        n = lengths[-1]
        took = statistics.median(s for m, s in measured if m == n)
        if total == n:
            return PrefillEstimate(total, took, "measured", card.device, measured=(n, took))
        # All of it fixed cost, or all of it per token: the truth lies between.
        ends = sorted((took, took * total / n))
        low = max(ends[0], least or 0.0)
        high = max(ends[1], low)
        return PrefillEstimate(total, high, "rough", card.device, low_s=low, measured=(n, took))
    if least is not None:
        rate = total / least if least > 0 else None
        return PrefillEstimate(total, least, "roofline", card.device, rate=rate)
    return None
