"""Over-saturation: an open-loop point whose engine cannot keep up, seen while it runs.

Past the engine's capacity every new request waits longer than the last, so the point
measures the length of the queue, not the engine: GuideLLM stops such a point early, and
so does kvscope. Two signs, from the client's own view (so they hold for every engine):

- the queue grows through the point: the requests outstanding (sent, not finished),
  averaged over each quarter of the time since the first reply ended, rise from quarter
  to quarter, by at least `min_growth` requests and half again over the first quarter.
  Before any reply has ended the queue rises under every load (from 0 to rate x E2EL,
  Little's law): that is the point starting, not the engine falling behind;
- TTFT rises linearly in time: over the first tokens so far, TTFT against send time has
  a correlation of at least `min_r` and the fitted line at least doubles.

A closed loop cannot over-saturate (its users wait for their replies) and a rate of `inf`
sends everything at once, so neither is checked.

A request that failed says nothing about capacity: a server that stalls streams until the
timeout grows a queue too, one that answers HTTP 500 serves nobody. Once one has failed
neither sign is read, so such a point runs to its end, counts its failures and is never
called over-saturated.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field


@dataclass
class SaturationWatch:
    """Fed with each send, end and first token of a point; `verdict()` says when to stop."""

    min_requests: int = 16  # sends before either sign counts
    min_ended: int = 4  # and replies: a queue is only known to grow once some get served
    windows: int = 4
    min_growth: float = 4.0
    min_r: float = 0.9
    min_first_tokens: int = 12
    _outstanding: list[tuple[float, int]] = field(default_factory=list)
    _ttft: list[tuple[float, float]] = field(default_factory=list)
    _start: float | None = None
    _sent: int = 0
    _in_flight: int = 0
    _ended: int = 0
    _failed: int = 0
    _first_end: float | None = None  # where the ramp-up ends and the queue can be judged

    def sent(self, at: float) -> None:
        if self._start is None:
            self._start = at
        self._sent += 1
        self._in_flight += 1
        self._outstanding.append((at, self._in_flight))

    def ended(self, at: float, *, failed: bool = False) -> None:
        self._in_flight -= 1
        self._ended += 1
        self._failed += failed
        if self._first_end is None:
            self._first_end = at
        self._outstanding.append((at, self._in_flight))

    def first_token(self, sent_at: float, ttft_s: float) -> None:
        self._ttft.append((sent_at, ttft_s))

    def verdict(self, now: float) -> str | None:
        """Why the point is over-saturated, in one sentence; None while it is not."""
        if self._start is None or self._sent < self.min_requests or self._ended < self.min_ended:
            return None
        if self._failed:
            return None  # failures, not a queue: the point counts them to its end
        return self._queue_grows(now) or self._ttft_climbs()

    def _queue_grows(self, now: float) -> str | None:
        begin = self._first_end
        if begin is None:
            return None
        span = now - begin
        if span <= 0:
            return None
        means = []
        for k in range(self.windows):
            lo = begin + span * k / self.windows
            hi = lo + span / self.windows
            last = k == self.windows - 1
            inside = [n for t, n in self._outstanding if lo <= t < hi or (last and t == hi)]
            if not inside:
                return None
            means.append(sum(inside) / len(inside))
        rising = all(b > a for a, b in itertools.pairwise(means))
        grew = means[-1] - means[0]
        if rising and grew >= max(self.min_growth, 0.5 * means[0]):
            return (
                f"over-saturated: the queue grew through the point, from {means[0]:.1f} "
                f"to {means[-1]:.1f} requests outstanding over {span:.1f} s"
            )
        return None

    def _ttft_climbs(self) -> str | None:
        pts = self._ttft
        if len(pts) < self.min_first_tokens:
            return None
        fit = _line(pts)
        if fit is None:
            return None
        slope, intercept, r = fit
        t0, t1 = min(t for t, _ in pts), max(t for t, _ in pts)
        first, last = intercept + slope * t0, intercept + slope * t1
        if r >= self.min_r and slope > 0 and last >= 2 * max(first, 1e-9):
            return (
                f"over-saturated: TTFT rose linearly in time, from {first * 1e3:,.0f} ms to "
                f"{last * 1e3:,.0f} ms over {t1 - t0:.1f} s (r = {r:.2f})"
            )
        return None


def _line(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least squares y = a x + b, with Pearson's r; None when x or y does not vary."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    if sxx <= 0 or syy <= 0:
        return None
    slope = sxy / sxx
    return slope, my - slope * mx, sxy / math.sqrt(sxx * syy)
