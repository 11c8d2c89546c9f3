"""The engine panel's three figures, built from the telemetry ring buffers.

None has an x label: each box's title says what x is, and at 48 rows the row is worth
more to the data (see `axes.row_axis`).

Pure functions of the buffers, so a test can check what a plot would show (its series,
its ticks and their labels) without drawing it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from engine.stats import percentile
from tui import axes
from tui.plotting import Figure, Rule, Series, envelope, log10_series, strip_data_rows
from tui.telemetry.buffers import KV_WINDOW_S, LatencyPoint, Telemetry

# Glyphs of the latency plot: each series its own, so they read apart without colour.
TTFT_MARK = "•"
QUEUED_MARK = "◇"
ITL_MARK = "×"
# A point measured while the host was busy: hollow and dim, its own series, so that a
# TTFT the host's other work slowed is not read as the engine's.
BUSY_TTFT_MARK = "○"
BUSY_ITL_MARK = "+"
BUSY_ROLE = "axes"
"""The plot's muted colour: the busy points recede behind the engine's own."""


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


def itl_figure(
    tel: Telemetry, columns: int, rows: int = 10
) -> tuple[Figure | None, Percentiles | None]:
    """ITL per token of the tracked request, with its p50/p90/p99 as rules."""
    values = list(tel.itl_ms)
    if not values:
        return None, None
    pct = itl_percentiles(values)
    assert pct is not None
    xs = [float(i + 1) for i in range(len(values))]
    # Braille gives two dots per column: more points than that only costs drawing time.
    ex, ey = envelope(xs, values, max(columns * 2, 8))
    rules = [Rule(pct.p50, "p50"), Rule(pct.p90, "p90"), Rule(pct.p99, "p99")]
    # The spike cursor (keys [ and ] on the focused box): a vertical line at its token.
    # x is the token's index: the ITL of token i (i >= 1) is drawn at x = i.
    if tel.cursor is not None and 1 <= tel.cursor <= len(values):
        rules.append(Rule(float(tel.cursor), "series-alt", vertical=True))
    figure = Figure(
        series=(Series(ex, ey, role="series"),),
        rules=tuple(rules),
        xaxis=axes.token_axis(len(values), columns),
        yaxis=axes.duration_axis(max(values), axes.plot_rows(rows, xlabel=False)),
    )
    return figure, pct


LatencyScale = Literal["linear", "strips", "log"]
"""How the latency plot's y axis reads: one linear axis; two linear strips (TTFT above,
median ITL below, sharing x) when their ranges differ more than tenfold; or log10."""


@dataclass(frozen=True)
class LatencySummary:
    """What the latency plot's title and key say about the points it shows."""

    requests: int
    queued: int
    queue_removed: int  # queued points drawn at their TTFT less the queue time
    longest_queue_ms: float | None
    scale: LatencyScale = "linear"
    host_busy: int = 0
    """Points measured while the host was busy (drawn hollow, apart from the others)."""


TTFT_STRIP = "TTFT"
ITL_STRIP = "median ITL"
LOG_LABEL = "log y"
"""Written into the plot's frame: each strip names its series, a log axis says it is."""
MIN_STRIP_ROWS = 4
"""Rows of data a strip needs to be read: with fewer, a 24 ms ITL on a 0-50 ms axis of
two rows rounds onto the zero row, which is what the strips are there to prevent."""


def latency_figure(
    tel: Telemetry, columns: int, rows: int = 10, *, log_y: bool = False
) -> tuple[Figure | None, LatencySummary]:
    """TTFT and median ITL of every request this session against its prompt length.

    The article's finding draws itself: TTFT rises with the prompt, ITL stays flat.
    Both must be readable: where the largest TTFT is more than ten times the largest
    median ITL (seconds against tens of ms), one linear axis would lay every ITL on its
    zero row, so each gets its own strip, TTFT above and ITL below, on the same x axis;
    a plot too short for two strips gets one log axis. `log_y` (Ctrl+Y) asks for the log
    axis whatever the ranges. A log axis is named in the frame.

    A copy that waited behind others is drawn with its own glyph, at its TTFT less the
    time it queued where that is known, so one long wait does not flatten every other
    point onto the axis. A point measured while the host was busy is drawn hollow and
    dim (its TTFT as a queued one's), whatever else it was: its timings are the host's.
    """
    points = list(tel.points)
    summary = _summarize(points)
    if not points:
        return None, summary
    calm = [p for p in points if p.host_busy is None]
    busy = [p for p in points if p.host_busy is not None]
    served = [p for p in calm if not p.queued and p.ttft_ms is not None]
    queued = [p for p in calm if p.queued and p.service_ttft_ms is not None]
    itl = [p for p in calm if p.median_itl_ms is not None]
    busy_ttft = [p for p in busy if p.service_ttft_ms is not None]
    busy_itl = [p for p in busy if p.median_itl_ms is not None]

    def xy(chosen: list[LatencyPoint], value: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        xs = tuple(float(p.prompt_tokens) for p in chosen)
        ys = tuple(float(getattr(p, value)) for p in chosen)
        return xs, ys

    qx, qy = xy(queued, "service_ttft_ms")
    tx, ty = xy(served, "ttft_ms")
    ix, iy = xy(itl, "median_itl_ms")
    bx, by = xy(busy_ttft, "service_ttft_ms")
    bix, biy = xy(busy_itl, "median_itl_ms")
    every_y = [*qy, *ty, *iy, *by, *biy]
    if not every_y:
        return None, summary
    right = max(p.prompt_tokens for p in points) * 1.05 or 1.0
    xaxis = axes.token_axis(right, columns)
    queued_series = Series(qx, qy, role="marker", kind="scatter", marker=QUEUED_MARK)
    ttft_series = Series(tx, ty, role="series", kind="scatter", marker=TTFT_MARK)
    itl_series = Series(ix, iy, role="series-alt", kind="scatter", marker=ITL_MARK)
    busy_series = Series(bx, by, role=BUSY_ROLE, kind="scatter", marker=BUSY_TTFT_MARK)
    busy_itl_series = Series(bix, biy, role=BUSY_ROLE, kind="scatter", marker=BUSY_ITL_MARK)
    # Busy points first: the engine's own points are drawn over them.
    ttft_all = (busy_series, queued_series, ttft_series)
    itl_all = (busy_itl_series, itl_series)
    ttft_ys = (*by, *qy, *ty)
    itl_ys = (*biy, *iy)

    upper_rows, lower_rows = strip_data_rows(rows)
    apart = axes.ranges_differ([ttft_ys, itl_ys])
    if not log_y and apart and min(upper_rows, lower_rows) >= MIN_STRIP_ROWS:
        lower = Figure(
            series=tuple(s for s in itl_all if s.xs),
            xaxis=xaxis,
            yaxis=axes.duration_axis(max(itl_ys), lower_rows),
            label=ITL_STRIP,
        )
        upper = Figure(
            series=tuple(s for s in ttft_all if s.xs),
            xaxis=xaxis,
            yaxis=axes.duration_axis(max(ttft_ys), upper_rows),
            label=TTFT_STRIP,
            below=lower,
        )
        return upper, replace(summary, scale="strips")
    # Too few rows for two strips: one log axis still shows both, and says it is log.
    log_y = log_y or apart

    if log_y:
        yaxis = axes.log_duration_axis(min(every_y), max(every_y))
    else:
        yaxis = axes.duration_axis(max(every_y), axes.plot_rows(rows, xlabel=False))

    # ITL drawn last: the flat ITL line is half of the finding, and no TTFT point near
    # the axis may hide it.
    series = [log10_series(s) if log_y else s for s in (*ttft_all, *itl_all) if s.xs]
    figure = Figure(
        series=tuple(series),
        xaxis=xaxis,
        yaxis=yaxis,
        label=LOG_LABEL if log_y else "",
    )
    return figure, replace(summary, scale="log" if log_y else "linear")


def _summarize(points: list[LatencyPoint]) -> LatencySummary:
    # A busy point is drawn as busy, queued or not: the queued glyph counts the others.
    queued = [p for p in points if p.queued and p.host_busy is None]
    removed = [p for p in queued if p.queue_ms is not None]
    longest = max((p.queue_ms for p in removed if p.queue_ms is not None), default=None)
    busy = sum(1 for p in points if p.host_busy is not None)
    return LatencySummary(len(points), len(queued), len(removed), longest, host_busy=busy)


def kv_figure(
    tel: Telemetry, columns: int, rows: int = 10, window_s: float = KV_WINDOW_S
) -> Figure | None:
    """KV usage (0-100 %) over the last minute of engine time, preemptions marked."""
    xs, ys, marks = tel.kv_series(window_s)
    if not xs:
        return None
    ex, ey = envelope(xs, ys, max(columns * 2, 8))
    # A plot of one instant is a dot nobody sees: stretch it into a short flat line.
    if len(ex) == 1:
        ex, ey = (ex[0] - 1e-3, ex[0]), (ey[0], ey[0])
    # Too many marks would paint the plot solid; the title carries the exact count.
    rules = tuple(Rule(t, "marker", vertical=True) for t in marks[-24:])
    return Figure(
        series=(Series(ex, ey, role="series"),),
        rules=rules,
        xaxis=axes.seconds_ago_axis(window_s, columns),
        yaxis=axes.percent_axis(axes.plot_rows(rows, xlabel=False)),
    )
