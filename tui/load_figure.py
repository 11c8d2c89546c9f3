"""The load plot: each load point's output tokens/s against its median ITL, labelled with
its users, the roofline's batched-decode curve behind them, the knee marked.

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
from tui.plotting import Figure, Note, Rule, Series

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


def point_tag(p: LoadPoint) -> str:
    """What a point is labelled with on the plot: its users, or its request rate."""
    if p.max_concurrency is not None:
        return f"{p.max_concurrency}"
    return f"{p.request_rate:g}/s" if p.request_rate is not None else "?"


def load_key(
    figure: Figure | None,
    points: Sequence[LoadPoint],
    ceiling: Callable[[int], float] | None,
    *,
    off_chart: bool = True,
    extra: str = "",
) -> str:
    """The load plot's key: only what `figure` draws, in its glyphs and the colours of
    their roles. With `off_chart`, a roofline whose whole curve is past the measured range
    (the figure leaves it out rather than squash the points into a corner) is named here
    too; the figure's frame says so anyway, for a key too narrow to hold it. `extra`: a
    saved run's entry."""
    shown = plotted(points)
    unit = "users" if all(p.max_concurrency is not None for p in shown) else "load"
    entries = [f"[$primary]{POINT_MARK}N[/] measured at N {unit}"]
    if figure is not None and any(s.marker == ROOF_MARK for s in figure.series):
        entries.append(f"[$success]{ROOF_MARK}[/] roofline")
    elif off_chart and ceiling is not None and shown:
        words = f"roofline off the chart (≥ {ceiling(1):,.0f} tok/s)"
        entries.append(f"[$success]{ROOF_MARK}[/] {words}")
    if figure is not None and figure.rules:
        entries.append("[$error]│[/] knee")
    if extra:
        entries.append(extra)
    return "  ".join(entries)


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
    # Known but not drawn: said on the plot itself, where a reader looks for the curve.
    drawn = any(s.marker == ROOF_MARK for s in series)
    label = (
        f"roofline off the chart: ≥ {ceiling(1):,.0f} tok/s"
        if ceiling is not None and points and not drawn
        else ""
    )
    k = knee(list(points))
    rules = (Rule(k.output_throughput, "marker", vertical=True),) if k is not None else ()
    # Each point carries its users ("●8"), drawn from the point's own cell rightwards:
    # the axis reaches far enough right for the widest label to stay inside the frame.
    notes = tuple(
        Note(p.output_throughput, p.median_itl_ms, f"{POINT_MARK}{point_tag(p)}") for p in points
    )
    widest = max((len(n.text) for n in notes), default=1)
    room = top_x * widest / max(8, columns - 12)
    return Figure(
        series=tuple(series),
        rules=rules,
        notes=notes,
        label=label,
        xaxis=axes.token_axis(top_x * 1.05 + room, columns),
        yaxis=axes.duration_axis(top_y * 1.2, axes.plot_rows(rows, xlabel=False)),
    )
