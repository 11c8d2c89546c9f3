"""The load plot: each load point's output tokens/s against its median ITL, the roofline's
batched-decode curve behind them, the knee marked.

While decode is bound by reading the weights, a bigger batch costs little more per step,
so throughput climbs along the curve's flat part at almost the same ITL; past the knee,
ITL (and TTFT) grow instead. The playground's Load box (`load_figure`) and the sweep
screen's load sweep (`load_points_figure`, with a saved run drawn under it) draw the same
figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tui import axes
from tui.live_load import knee
from tui.plotting import Figure, Rule, Series

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from bench.load_result import LoadPoint
    from tui.live_load import LiveLoad

POINT_MARK = "●"
ROOF_MARK = "·"


def load_figure(load: LiveLoad, columns: int, rows: int = 10) -> Figure | None:
    """The Load box's figure, from the playground's points and ceiling."""
    return load_points_figure(load.points, load.ceiling, columns, rows)


def plotted(points: Iterable[LoadPoint]) -> list[LoadPoint]:
    """The points a load plot can place: measured, with some output."""
    return [p for p in points if p.ok and p.output_throughput > 0]


def load_points_figure(
    load_points: Iterable[LoadPoint],
    ceiling: Callable[[int], float] | None,
    columns: int,
    rows: int = 10,
    saved: Sequence[Series] = (),
) -> Figure | None:
    """Output tok/s (x) against median ITL (y) of `load_points`, the roofline's batched
    curve behind them (`ceiling`), and `saved` (a loaded run's series) under them."""
    points = plotted(load_points)
    if not points and not saved:
        return None
    xs = tuple(p.output_throughput for p in points)
    ys = tuple(p.median_itl_ms for p in points)
    series = [*saved]
    if points:
        series.append(Series(xs, ys, role="series", kind="scatter", marker=POINT_MARK))
    every_x = [*xs, *(x for s in saved for x in s.xs)]
    top_x, top_y = max(every_x), max([*ys, *(y for s in saved for y in s.ys)])
    if ceiling is not None and points:
        most = max(p.max_concurrency or 1 for p in points)
        batches = sorted({1, 2, *range(4, 4 * most + 1, max(1, most // 4))})
        curve = [(ceiling(b), b / ceiling(b) * 1e3) for b in batches]
        # Only the part of the curve inside the measured range: the roofline's upper
        # reaches would flatten the points into one corner.
        kept = [(x, y) for x, y in curve if x <= top_x * 1.5]
        if kept:
            series.insert(
                0,
                Series(
                    tuple(x for x, _ in kept),
                    tuple(y for _, y in kept),
                    role="p50",
                    kind="scatter",
                    marker=ROOF_MARK,
                ),
            )
            top_x = max(top_x, *(x for x, _ in kept))
    k = knee(list(points))
    rules = (Rule(k.output_throughput, "marker", vertical=True),) if k is not None else ()
    return Figure(
        series=tuple(series),
        rules=rules,
        xaxis=axes.token_axis(top_x * 1.05, columns),
        yaxis=axes.duration_axis(top_y * 1.2, axes.plot_rows(rows, xlabel=False)),
    )
