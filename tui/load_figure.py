"""The load plot: each load point's output tokens/s against its median ITL, the roofline's
batched-decode curve behind them, the knee marked.

While decode is bound by reading the weights, a bigger batch costs little more per step,
so throughput climbs along the curve's flat part at almost the same ITL; past the knee,
ITL (and TTFT) grow instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tui import axes
from tui.live_load import knee
from tui.plotting import Figure, Rule, Series

if TYPE_CHECKING:
    from tui.live_load import LiveLoad

POINT_MARK = "●"
ROOF_MARK = "·"


def load_figure(load: LiveLoad, columns: int, rows: int = 10) -> Figure | None:
    points = [p for p in load.points if p.ok and p.output_throughput > 0]
    if not points:
        return None
    xs = tuple(p.output_throughput for p in points)
    ys = tuple(p.median_itl_ms for p in points)
    series = [Series(xs, ys, role="series", kind="scatter", marker=POINT_MARK)]
    top_x, top_y = max(xs), max(ys)
    if load.ceiling is not None:
        most = max(p.max_concurrency or 1 for p in points)
        batches = sorted({1, 2, *range(4, 4 * most + 1, max(1, most // 4))})
        curve = [(load.ceiling(b), b / load.ceiling(b) * 1e3) for b in batches]
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
