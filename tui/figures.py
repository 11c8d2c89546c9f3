"""The engine panel's three figures, built from the telemetry ring buffers.

Pure functions of the buffers, so a test can check what a plot would show without
drawing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.stats import percentile
from tui.plotting import Figure, Rule, Series, envelope
from tui.telemetry import Telemetry


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float

    def caption(self) -> str:
        return f"p50 {self.p50:.1f} · p90 {self.p90:.1f} · p99 {self.p99:.1f} ms"


def itl_percentiles(values_ms: list[float]) -> Percentiles | None:
    if not values_ms:
        return None
    return Percentiles(
        percentile(values_ms, 50), percentile(values_ms, 90), percentile(values_ms, 99)
    )


def itl_figure(tel: Telemetry, columns: int) -> tuple[Figure | None, Percentiles | None]:
    """ITL per token of the tracked request, with its p50/p90/p99 as rules."""
    values = list(tel.itl_ms)
    if not values:
        return None, None
    pct = itl_percentiles(values)
    assert pct is not None
    xs = [float(i + 1) for i in range(len(values))]
    # Braille gives two dots per column: more points than that only costs drawing time.
    ex, ey = envelope(xs, values, max(columns * 2, 8))
    top = max(values) * 1.15 or 1.0
    figure = Figure(
        series=(Series(ex, ey, role="series"),),
        rules=(Rule(pct.p50, "p50"), Rule(pct.p90, "p90"), Rule(pct.p99, "p99")),
        xlabel="token",
        ylim=(0.0, top),
    )
    return figure, pct


def ttft_figure(tel: Telemetry) -> Figure | None:
    """TTFT of every request this session against its prompt length."""
    if not tel.ttft_points:
        return None
    xs = tuple(float(p) for p, _ in tel.ttft_points)
    ys = tuple(t for _, t in tel.ttft_points)
    top = max(ys) * 1.15 or 1.0
    right = max(xs) * 1.05 or 1.0
    return Figure(
        series=(Series(xs, ys, role="series-alt", kind="scatter"),),
        xlabel="prompt tokens",
        ylim=(0.0, top),
        xlim=(0.0, right),
    )


def kv_figure(tel: Telemetry, columns: int) -> Figure | None:
    """KV usage (0-100 %) over engine time, with steps that preempted marked."""
    xs, ys, marks = tel.kv_series()
    if not xs:
        return None
    ex, ey = envelope(xs, ys, max(columns * 2, 8))
    # A plot of one instant is a dot nobody sees: stretch it into a short flat line.
    if len(ex) == 1:
        ex, ey = (ex[0], ex[0] + 1e-3), (ey[0], ey[0])
    # Too many marks would paint the plot solid; the title carries the exact count.
    rules = tuple(Rule(t, "marker", vertical=True) for t in marks[-24:])
    return Figure(
        series=(Series(ex, ey, role="series"),),
        rules=rules,
        xlabel="seconds",
        ylim=(0.0, 100.0),
    )
