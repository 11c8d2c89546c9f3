"""PrefillFit: a step's prefill time as a fixed cost plus a per-token rate, fitted by least
squares to the prefill steps this session measured.

A prompt's prefill is not all per-token work: each step pays a fixed cost (scheduling,
launching the kernels, the sampler) whatever its length. On a CPU a 100-token prefill took
2.4 s, nearly all of it fixed; read as a rate (42 tokens/s) it made a 512-token prompt
"≈ 12 s", five times what it took. Two lengths tell the two apart; one cannot.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass(frozen=True)
class PrefillFit:
    """seconds = fixed_s + per_token_s x tokens, for one prefill step of `tokens`."""

    fixed_s: float
    per_token_s: float
    steps: int
    """How many measured steps the line was fitted to."""

    @property
    def rate(self) -> float:
        """Prompt tokens per second once the fixed cost is paid."""
        return 1.0 / self.per_token_s

    def seconds(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens


def fit_prefill(pairs: Iterable[tuple[int, float]]) -> PrefillFit | None:
    """The least-squares line through (prefill tokens, seconds), or None when no rate can
    be told: fewer than two distinct lengths, or longer prefills no slower than shorter.

    A line that would take negative time at 0 tokens is refitted through the origin: a
    fixed cost cannot be negative, and the rate is then what the points say alone.
    """
    points = [(float(n), s) for n, s in pairs if n > 0 and s > 0]
    if len({n for n, _ in points}) < 2:
        return None
    count = len(points)
    mean_x = sum(n for n, _ in points) / count
    mean_y = sum(s for _, s in points) / count
    sxx = sum((n - mean_x) ** 2 for n, _ in points)
    sxy = sum((n - mean_x) * (s - mean_y) for n, s in points)
    slope = sxy / sxx
    if slope <= 0:
        return None
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        fixed = 0.0
        slope = sum(n * s for n, s in points) / sum(n * n for n, _ in points)
    return PrefillFit(fixed, slope, count)


class PrefillSteps:
    """The recent prefill steps, kept by length, so that many steps of one length (every
    load user prefills the same prompt) never push out the only other length measured,
    which the fit needs to tell a fixed cost from a rate."""

    def __init__(self, *, lengths: int = 32, per_length: int = 8) -> None:
        self._lengths = lengths
        self._per_length = per_length
        self._by_length: OrderedDict[int, deque[float]] = OrderedDict()

    def add(self, tokens: int, seconds: float) -> None:
        times = self._by_length.get(tokens)
        if times is None:
            times = self._by_length[tokens] = deque(maxlen=self._per_length)
            if len(self._by_length) > self._lengths:
                self._by_length.popitem(last=False)  # the length measured longest ago
        else:
            self._by_length.move_to_end(tokens)
        times.append(seconds)

    def pairs(self) -> tuple[tuple[int, float], ...]:
        """Every kept (prefill tokens, seconds), oldest length first."""
        return tuple((n, s) for n, times in self._by_length.items() for s in times)

    def clear(self) -> None:
        self._by_length.clear()
