"""HostWatch: says when the host itself makes the timings noisy (load, step-time spread)."""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.stats import percentile
from tui import format as fmt

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import StepSample


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

    def usual_decode_s(self, batch: int) -> float | None:
        """The median of recent decode-only steps of `batch` requests (None before 6)."""
        times = [d for n, d in self._decode_steps if n == batch]
        if len(times) < 6:
            return None
        return percentile(times, 50)

    def load_words(self) -> str | None:
        """ "load 5.0 on 2 cores" when the load is above the cores (a CPU engine only)."""
        if not self.check_load:
            return None
        load = self.load_average()
        if load is None or load <= self.cores:
            return None
        return f"load {load:.1f} on {self.cores} cores"

    def stall_words(self, batch: int, took_s: float) -> str | None:
        """Why a decode step of `batch` requests took `took_s`, when the host is the
        likeliest cause: it took many times the usual step of that batch, or the load is
        above the cores. None when the step looks like the engine's own work."""
        usual = self.usual_decode_s(batch)
        slow = usual is not None and usual > 0 and took_s > self.spread_limit * usual
        load = self.load_words()
        if not slow and load is None:
            return None
        parts: list[str] = []
        if usual is not None and slow:
            parts.append(f"{took_s / usual:,.0f}× a usual {fmt.ms(usual)} step")
        if load is not None:
            parts.append(load)
        return "the host was busy (" + "; ".join(parts) + ")"

    def busy_words(self) -> str | None:
        """ "load 3.0 on 2 cores; decode steps vary ×4.2" while the host is busy, else None.

        Read when a request finishes, to mark its point on the latency plot: a TTFT taken
        while other processes held the cores is not the engine's own."""
        parts: list[str] = []
        load = self.load_words()
        if load is not None:
            parts.append(load)
        spread = self.step_spread()
        if spread is not None and spread > self.spread_limit:
            parts.append(f"decode steps vary ×{spread:.1f}")
        return "; ".join(parts) if parts else None

    def warning(self) -> HostWarning | None:
        busy = self.busy_words()
        if busy is None:
            return None
        return HostWarning(f"⚠ host busy: {busy}: timings are noisy")
