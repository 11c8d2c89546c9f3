"""The sweep screen's load results: the throughput-vs-latency plot (the playground's load
figure, `tui.load_figure`), the notes of each level (queueing, over-saturation), a loaded
run's legend, and the table. It shows what it is given; the screen runs the load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tui import format as fmt
from tui.live_load import knee
from tui.load_figure import load_key, load_points_figure
from tui.sweep.load_view_model import batch_cell, number, point_notes, result_cell
from tui.sweep.overlay import load_overlay_text
from tui.widgets.box_titles import retitle
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from textual.app import ComposeResult

    from bench.load_result import LoadPoint
    from tui.plotting import PlotRenderer
    from tui.sweep.overlay import LoadOverlay

TITLE = "Load: output tok/s vs median ITL"
COLUMNS = (
    "load",
    "done",
    "out tok/s",
    "roofline",
    "ITL p50",
    "ITL p99",
    "TTFT p99",
    "batch",
    "queued",
    "result",
)


class LoadSweepResults(Vertical):
    """Plot, notes, legend and table of one load sweep (ids prefixed `load-sweep-`)."""

    DEFAULT_CSS = """
    LoadSweepResults { height: 1fr; }
    LoadSweepResults #load-sweep-box { height: 1fr; }
    LoadSweepResults #load-sweep-notes, LoadSweepResults #load-sweep-overlay {
        height: auto;
        padding: 0 1;
    }
    LoadSweepResults #load-sweep-notes { color: $warning; }
    LoadSweepResults #load-sweep-table { height: auto; max-height: 12; }
    """

    def compose(self) -> ComposeResult:
        with Vertical(classes="box", id="load-sweep-box") as box:
            box.border_title = TITLE
            box.border_subtitle = load_key(None, (), None)
            yield Plot("each load level lands here as it is measured", id="load-sweep-plot")
        yield Static("", id="load-sweep-notes")
        yield Static("", id="load-sweep-overlay")
        yield DataTable(id="load-sweep-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.query_one("#load-sweep-notes").display = False
        self.query_one("#load-sweep-overlay").display = False

    def clear(self) -> None:
        self.query_one(DataTable).clear()
        self.show_notes([])

    def add_row(self, p: LoadPoint) -> None:
        roof = p.roofline_output_throughput
        self.query_one(DataTable).add_row(
            p.label,
            f"{p.completed}" + (f" +{p.aborted} cut" if p.aborted else ""),
            number(p.output_throughput),
            number(roof, 0) if roof is not None else "–",
            number(p.median_itl_ms),
            number(p.p99_itl_ms),
            number(p.p99_ttft_ms, 0),
            batch_cell(p),
            f"{p.queued_requests}",
            Text(result_cell(p), style="" if p.ok and not p.stopped_early else "bold"),
        )

    def show_notes(self, points: Sequence[LoadPoint]) -> None:
        lines = point_notes(list(points))
        box = self.query_one("#load-sweep-notes", Static)
        box.display = bool(lines)
        box.update(Text("\n".join(lines)))

    def show_overlay(self, overlay: LoadOverlay | None, live: Sequence[LoadPoint]) -> None:
        legend = self.query_one("#load-sweep-overlay", Static)
        legend.display = overlay is not None
        if overlay is not None:
            legend.update(load_overlay_text(overlay, live))

    async def redraw(
        self,
        renderer: PlotRenderer,
        points: Sequence[LoadPoint],
        ceiling: Callable[[int], float] | None,
        overlay: LoadOverlay | None,
        version: object,
    ) -> None:
        plot = self.query_one("#load-sweep-plot", Plot)
        width, height = plot.content_size
        saved = overlay.series() if overlay is not None else []
        figure = load_points_figure(points, ceiling, width, height, saved)
        plot.set_figure(figure, version)
        k = knee(list(points))
        count = f" · {fmt.count(len(points), 'level')}" if points else ""
        where = f" · knee at {k.label}" if k is not None else ""
        retitle(
            self.query_one("#load-sweep-box"),
            f"{TITLE}{count}{where}",
            load_key(figure, points, ceiling, extra=overlay.key() if overlay is not None else ""),
        )
        job = plot.job()
        if job is None:
            return
        (ansi,) = await renderer.draw([job])
        if plot.is_mounted:
            plot.apply(job, ansi)
