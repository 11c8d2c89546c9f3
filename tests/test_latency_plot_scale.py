"""Both series of "latency vs prompt tokens" are readable by default.

One linear axis from 0 to 150 s put every median-ITL × on the zero row, on screen and in
the README's screenshot: "ITL stays flat" read as "ITL is absent". Where the ranges differ
more than tenfold, TTFT and ITL now get a strip each (same x axis, own y axis, each named
in its frame); Ctrl+Y's log axis says it is log. The sweep screen's plots (a floor far
under its measurements, a p99 far over its median) switch to a named log axis.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from bench.sweep_result import SweepMetrics, SweepPoint
from tui.figures import ITL_MARK, ITL_STRIP, LOG_LABEL, TTFT_MARK, TTFT_STRIP, latency_figure
from tui.plotting import Figure, PlotJob, build_plot
from tui.sweep.prompt_view_model import sweep_figures
from tui.telemetry.buffers import LatencyPoint

if TYPE_CHECKING:
    from tui.telemetry.buffers import Telemetry

ANSI = re.compile(r"\x1b\[[0-9;]*m")
WIDTH, HEIGHT = 56, 14  # room for two strips of 4 rows or more


def _telemetry(rows: list[tuple[int, float, float]]) -> Telemetry:
    points = [
        LatencyPoint(f"r{i}", n, ttft, itl, None, queued=False)
        for i, (n, ttft, itl) in enumerate(rows)
    ]
    return cast("Telemetry", SimpleNamespace(points=points))


# The tour on a slow CPU: TTFT from 16 s to 150 s, median ITL 25-30 ms.
SLOW_CPU = [
    (512, 8_000.0, 25.0),
    (1024, 16_000.0, 26.0),
    (2048, 45_000.0, 28.0),
    (4096, 150_000.0, 30.0),
]


def _draw(figure: Figure, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    text = build_plot(PlotJob((), figure, width, height, (("axes", (128, 128, 128)),)))
    lines = [ANSI.sub("", line) for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _row_label(line: str) -> str:
    """The y tick label of a plot row ("20 ms", "0"), or "" for an unlabelled row."""
    head = line.split("┤", 1)
    return head[0].strip() if len(head) == 2 and "│" not in head[0] else ""


def test_itl_gets_its_own_strip_when_ttft_is_a_thousand_times_larger() -> None:
    figure, summary = latency_figure(_telemetry(SLOW_CPU), WIDTH, HEIGHT)
    assert figure is not None
    assert summary.scale == "strips"
    assert figure.below is not None
    assert figure.label == TTFT_STRIP and figure.below.label == ITL_STRIP
    # The ITL strip's axis is in ms and tops out near the ITLs, not at 150 s.
    assert figure.below.yaxis is not None and figure.below.yaxis.hi < 100
    lines = _draw(figure)
    assert len(lines) == HEIGHT
    itl_rows = [line for line in lines if ITL_MARK in line]
    ttft_rows = [line for line in lines if TTFT_MARK in line]
    assert itl_rows and ttft_rows
    # Every ITL sits on a row of its own strip above zero, with an ms label near it.
    assert all(_row_label(line) != "0" for line in itl_rows), lines
    assert any(line.strip().startswith("├─ median ITL") for line in lines), lines
    assert lines[0].strip().startswith("┌─ TTFT")
    # The two strips' frames line up: one left edge for every row but the x labels.
    assert len({_left_edge(line) for line in lines[:-1]}) == 1, lines


def _left_edge(line: str) -> int:
    return min(line.index(c) for c in "┌├└┤│" if c in line)


def test_a_plot_too_short_for_two_strips_gets_a_named_log_axis() -> None:
    # The latency box at 160x48 has 9 rows: two strips would get 2-3 rows of data each,
    # and a 24 ms ITL on a two-row 0-50 ms axis rounds onto the zero row again.
    figure, summary = latency_figure(_telemetry(SLOW_CPU), WIDTH, 9)
    assert figure is not None
    assert summary.scale == "log"
    assert figure.below is None
    lines = _draw(figure, height=9)
    assert LOG_LABEL in lines[0]
    itl_rows = [line for line in lines if ITL_MARK in line]
    ttft_rows = [line for line in lines if TTFT_MARK in line]
    # Both series on rows of their own: the ITLs under every TTFT, none on the bottom.
    assert itl_rows and ttft_rows
    assert max(lines.index(r) for r in ttft_rows) < min(lines.index(r) for r in itl_rows)


def test_close_ranges_keep_one_linear_axis() -> None:
    rows = [(512, 40.0, 20.0), (1024, 60.0, 21.0), (2048, 110.0, 22.0)]
    figure, summary = latency_figure(_telemetry(rows), WIDTH, HEIGHT)
    assert figure is not None
    assert summary.scale == "linear"
    assert figure.below is None
    assert figure.label == ""


def test_ctrl_y_log_axis_is_named_on_the_plot() -> None:
    figure, summary = latency_figure(_telemetry(SLOW_CPU), WIDTH, HEIGHT, log_y=True)
    assert figure is not None
    assert summary.scale == "log"
    assert any(LOG_LABEL in line for line in _draw(figure))


def _sweep_point(n: int, ttft: float, floor: float, itl: float, p99: float) -> SweepPoint:
    metrics = SweepMetrics(
        completed=1,
        mean_ttft_ms=ttft,
        median_itl_ms=itl,
        p99_itl_ms=p99,
        ttft_floor_ms=floor,
        itl_floor_ms=itl / 2,
    )
    return SweepPoint(n, True, None, metrics)


def test_the_sweep_plots_go_log_only_where_a_series_would_vanish() -> None:
    points = [
        _sweep_point(512, 480.0, 23.0, 25.0, 31.0),
        _sweep_point(1024, 990.0, 46.0, 26.0, 33.0),
    ]
    ttft, itl = sweep_figures(points, columns=WIDTH, rows=HEIGHT)
    assert ttft is not None and itl is not None
    # The floor is 20x under the mean TTFT: log, and the frame says so.
    assert ttft.label == LOG_LABEL
    assert any(LOG_LABEL in line for line in _draw(ttft))
    # Median, p99 and floor of ITL are within 3x: linear, as before.
    assert itl.label == ""
    assert itl.yaxis is not None and itl.yaxis.lo == 0.0
