"""Axis ticks a person can read: 1-2-5 steps, whole tokens, ms that become s, 0 at the bottom.

plotext picks its own ticks (24009.1, 16.7, ...); the figures give it these instead, as
positions with labels. Pure functions, so a test can read an axis without drawing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

STEPS = (1.0, 2.0, 5.0)


@dataclass(frozen=True)
class Axis:
    """Where an axis ends and the labelled ticks along it."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]


def nice_step(span: float, max_ticks: int) -> float:
    """The smallest 1, 2 or 5 × 10^k step that cuts `span` into at most `max_ticks` gaps."""
    if span <= 0:
        return 1.0
    gaps = max(1, max_ticks - 1)
    raw = span / gaps
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (*STEPS, 10.0):
        if mult * power >= raw * (1 - 1e-9):
            return mult * power
    return 10.0 * power  # pragma: no cover - the loop always returns


def nice_ticks(
    lo: float, hi: float, max_ticks: int = 5, *, whole: bool = False
) -> tuple[float, tuple[float, ...]]:
    """(step, ticks) on a 1-2-5 grid covering [lo, hi]; the last tick is >= hi.

    `whole` keeps the step at 1 or more (token counts have no fractions).
    """
    if hi <= lo:
        hi = lo + 1.0
    step = nice_step(hi - lo, max_ticks)
    if whole:
        step = max(1.0, round(step))
    first = math.floor(lo / step + 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step
    count = round((last - first) / step)
    ticks = tuple(round(first + i * step, 9) for i in range(count + 1))
    return step, ticks


def whole_label(value: float) -> str:
    """1,024 (a token count or an index)."""
    return f"{round(value):,}"


def duration_unit(top_ms: float) -> str:
    """The unit an axis that reaches `top_ms` is labelled in: "ms" or "s"."""
    return "s" if top_ms >= 1000.0 else "ms"


def ms_label(value_ms: float, unit: str) -> str:
    """A tick of a duration axis in `unit`: "0", "20 ms", "0.5 s", "12 s"."""
    if abs(value_ms) < 1e-9:
        return "0"
    if unit == "s":
        value = value_ms / 1000.0
        text = f"{value:,.3f}".rstrip("0").rstrip(".")
        return f"{text} s"
    text = f"{value_ms:,.3f}".rstrip("0").rstrip(".")
    return f"{text} ms"


def max_ticks_for(cells: int, label_width: int = 7) -> int:
    """How many labels fit along `cells` characters (at least 2)."""
    return max(2, min(6, cells // max(1, label_width)))


def token_axis(top: float, cells: int) -> Axis:
    """0 to `top` tokens, whole-number ticks."""
    _, ticks = nice_ticks(0.0, max(1.0, top), max_ticks_for(cells, 7), whole=True)
    return Axis(0.0, ticks[-1], ticks, tuple(whole_label(t) for t in ticks))


def duration_axis(top_ms: float, rows: int) -> Axis:
    """0 to `top_ms` (linear) over a data area of `rows` rows, ms or s labels, 0 at the
    bottom, each tick on a row (see `row_axis`)."""
    unit = duration_unit(max(top_ms, 1e-3))
    axis = row_axis(max(top_ms, 1e-3), rows, lambda t: ms_label(t, unit))
    if unit == "ms" and duration_unit(axis.ticks[-1]) == "s":
        # 0 … 1,000 ms: the top tick decides, so that every label has the same unit.
        axis = row_axis(max(top_ms, 1e-3), rows, lambda t: ms_label(t, "s"))
    return axis


def log_duration_axis(lo_ms: float, hi_ms: float) -> Axis:
    """A log10 axis over [lo_ms, hi_ms], in log10(ms) units.

    The figure plots log10 of its values against this axis (plotext's own log scale
    labels its ticks 10^k only). Within two decades the ticks are 1-2-5 × 10^k; wider,
    the powers of ten, with the ends at the nearest 1-2-5 values outside the data.
    Each label carries its own unit: "20 ms", "100 ms", "1 s".
    """
    lo_ms = max(lo_ms, 1e-3)
    hi_ms = max(hi_ms, lo_ms * 1.01)
    k_lo = math.floor(math.log10(lo_ms))
    k_hi = math.ceil(math.log10(hi_ms))
    grid = [m * 10.0**k for k in range(k_lo, k_hi + 1) for m in STEPS]
    start = max(v for v in grid if v <= lo_ms * (1 + 1e-9))
    stop = min(v for v in grid if v >= hi_ms * (1 - 1e-9))
    if math.log10(stop / start) < 2 - 1e-9:
        kept = [v for v in grid if start <= v <= stop]
    else:
        powers = [10.0**k for k in range(k_lo, k_hi + 1) if start < 10.0**k < stop]
        kept = [start, *powers, stop]

    def label(value: float) -> str:
        return ms_label(value, duration_unit(value))

    return Axis(
        math.log10(start),
        math.log10(stop),
        tuple(math.log10(v) for v in kept),
        tuple(label(v) for v in kept),
    )


RANGE_FACTOR = 10.0
"""Series whose tops differ by more than this cannot share a linear axis: the smaller
lies on the larger's zero row (median ITL at 25 ms under TTFTs of 150 s)."""


def ranges_differ(groups: Sequence[Sequence[float]], factor: float = RANGE_FACTOR) -> bool:
    """Whether the tops of the non-empty `groups` differ by more than `factor`."""
    tops = [max(g) for g in groups if g]
    if len(tops) < 2:
        return False
    low = min(tops)
    return low <= 0 or max(tops) / low > factor


def percent_axis(rows: int = 9) -> Axis:
    """0-100 % over a data area of `rows` rows, each tick on a row."""
    return row_axis(100.0, rows, lambda t: f"{t:g}%")


def seconds_ago_axis(window_s: float, cells: int) -> Axis:
    """-window .. 0 seconds, labelled "-60 s" ... "now"."""
    _, ticks = nice_ticks(0.0, window_s, max_ticks_for(cells, 7), whole=True)
    ticks = tuple(t for t in ticks if t <= window_s)
    positions = tuple(-t for t in reversed(ticks))
    labels = tuple("now" if p == 0 else f"{p:.0f} s" for p in positions)
    return Axis(-window_s, 0.0, positions, labels)


def row_axis(top: float, rows: int, label: Callable[[float], str]) -> Axis:
    """A 0-based axis to at least `top` whose ticks each land exactly on a row.

    A terminal plot has whole rows: ticks 0-25-50-75-100 over 10 rows fall 2, 1, 2, 2
    rows apart, which reads as an uneven scale. Here each step of the tick grid is exactly
    k rows: the axis ends at step × (rows − 1) / k. Of the 1-2-5 steps and the k that
    reach `top`, the one chosen wastes the fewest rows above the data and keeps 3 to 6
    labels at least two rows apart.
    """
    top = max(top, 1e-9)
    rows = max(2, rows)
    best: tuple[float, float, float] | None = None  # (score, step, hi)
    base = 10.0 ** math.floor(math.log10(top / 6))
    steps = sorted({m * base * 10.0**e for m in STEPS for e in (0, 1, 2)})
    for step in steps:
        for k in range(1, rows):
            hi = step * (rows - 1) / k
            if hi < top * (1 - 1e-9):
                break  # larger k only lowers the top further
            labels = int(hi / step + 1e-9) + 1
            waste = (hi - top) / hi
            score = (
                4.0 * waste
                + (1.0 if k < 2 else 0.0)
                + 0.8 * max(0, 3 - labels)
                + 0.5 * max(0, labels - 6)
            )
            if best is None or score < best[0] - 1e-12:
                best = (score, step, hi)
    if best is None:  # pragma: no cover - k = 1 with the largest step always reaches top
        return Axis(0.0, top, (0.0, top), (label(0.0), label(top)))
    _, step, hi = best
    ticks = tuple(round(i * step, 9) for i in range(int(hi / step + 1e-9) + 1))
    return Axis(0.0, hi, ticks, tuple(label(t) for t in ticks))


def plot_rows(height: int, *, xlabel: bool = True) -> int:
    """Rows of the data area plotext leaves in a plot `height` rows high: its frame
    takes two, the x tick labels one, an x label one more."""
    return max(1, height - 3 - (1 if xlabel else 0))
