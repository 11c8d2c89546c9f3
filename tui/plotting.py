"""Plots as data, drawn with plotext 5.3.2.

plotext keeps one global figure, so every draw starts with `clf()`, and all draws run on
the event loop, one after the other. A draw is pure Python and costs a few milliseconds at
panel sizes, because figures are cut down to about two points per column first
(`envelope`).

Why not a plot thread: it would hold the GIL for whole draws, and the loop thread would
wait up to the 5 ms switch interval each time it released the GIL, stretching frames past
100 ms under a fast token stream. Small draws on the loop, at most one per timer tick
while streaming (see EnginePanel.redraw), keep the loop's lag to a few milliseconds.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import plotext as plt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tui.axes import Axis

RGB = tuple[int, int, int]
Palette = tuple[tuple[str, RGB], ...]
"""Colour roles ("series", "axes", "p99", ...) to RGB, taken from the theme by the widget."""
Colours = dict[str, RGB]


@dataclass(frozen=True)
class Series:
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    role: str = "series"
    kind: Literal["line", "scatter"] = "line"
    marker: str = ""
    """The glyph ("" = a dot for a scatter, braille for a line): series that mean
    different things (measured, floor, queued) must not look alike."""


def log10_series(s: Series) -> Series:
    """`s` with log10 of its values, for a `tui.axes.log_duration_axis` (which is in
    log10 units): values at or under zero sit at the axis' floor, 1 µs."""
    return replace(s, ys=tuple(math.log10(max(v, 1e-3)) for v in s.ys))


@dataclass(frozen=True)
class Rule:
    """A reference line: a percentile (horizontal) or a marked event (vertical)."""

    at: float
    role: str
    vertical: bool = False


@dataclass(frozen=True)
class Note:
    """Words written at a data point, starting on its cell ("●8": the point and its users)."""

    x: float
    y: float
    text: str
    role: str = "series"


@dataclass(frozen=True)
class Figure:
    series: tuple[Series, ...]
    rules: tuple[Rule, ...] = ()
    notes: tuple[Note, ...] = ()
    """Drawn last, over the series and rules, so that no line crosses a label."""
    xlabel: str = ""
    ylim: tuple[float, float] | None = None
    xlim: tuple[float, float] | None = None
    xaxis: Axis | None = None
    """Labelled ticks and limits for x; overrides `xlim` (see tui/axes.py)."""
    yaxis: Axis | None = None
    """Labelled ticks and limits for y; overrides `ylim`."""
    label: str = ""
    """Words written into the top edge of the frame ("TTFT", "log y"): what this y axis
    is, on the plot itself, where a reader looks."""
    below: Figure | None = None
    """A second strip drawn under this one, with its own y axis and this one's x axis:
    two series whose ranges differ a hundredfold each get their own rows, instead of one
    of them lying flat on the other's zero row. Its `xaxis` is ignored."""


def strip_heights(height: int) -> tuple[int, int]:
    """Heights of the upper and lower strips of a two-strip plot `height` rows high.

    They share a row (the upper's bottom edge is dropped; the lower's top edge divides
    them), and only the lower has x tick labels, so it is a row taller: each strip gets
    the same rows of data.
    """
    height = max(height, 9)
    lower = height // 2 + 1
    return height + 1 - lower, lower


def strip_data_rows(height: int) -> tuple[int, int]:
    """Rows of data in the upper and lower strips (frames and x labels taken off)."""
    upper, lower = strip_heights(height)
    return upper - 2, lower - 3


@dataclass(frozen=True)
class PlotJob:
    """One draw: a figure at a size in a palette. `key` says what it was drawn from."""

    key: tuple[object, ...]
    figure: Figure
    width: int
    height: int
    palette: Palette


def envelope(
    xs: Sequence[float], ys: Sequence[float], buckets: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """At most `buckets` points (one more for the last), keeping the highest of each run of
    neighbours, and always the last point.

    The maximum, not the mean, so that a single stalled token still shows as a spike
    after thousands of tokens are squeezed into a few dozen columns. The last point, so
    that a line ends at the value it has now: the pool emptied by the last request's end
    must not hide behind the full pool of the step just before it.
    """
    n = len(xs)
    if n <= buckets or buckets <= 0:
        return tuple(xs), tuple(ys)
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(buckets):
        lo = b * n // buckets
        hi = max(lo + 1, (b + 1) * n // buckets)
        best = max(range(lo, hi), key=ys.__getitem__)
        out_x.append(xs[best])
        out_y.append(ys[best])
    if out_x[-1] != xs[-1] or out_y[-1] != ys[-1]:
        out_x.append(xs[-1])
        out_y.append(ys[-1])
    return tuple(out_x), tuple(out_y)


def build_plot(job: PlotJob) -> str:
    """Draw `job` with plotext and return its ANSI text (on the event loop only)."""
    fig = job.figure
    if fig.below is None:
        return _draw(fig, job.width, job.height, dict(job.palette))
    return _draw_strips(fig, fig.below, job.width, job.height, dict(job.palette))


def _draw_strips(upper: Figure, lower: Figure, width: int, height: int, colours: Colours) -> str:
    top_h, low_h = strip_heights(height)
    # The y labels of both strips as wide as the widest, so the two frames line up.
    labels = [
        *(upper.yaxis.labels if upper.yaxis else ()),
        *(lower.yaxis.labels if lower.yaxis else ()),
    ]
    pad = max((len(t) for t in labels), default=0)
    top = _draw(_padded(upper, pad, xaxis=lower.xaxis, ticks=False), width, top_h, colours)
    low = _draw(_padded(lower, pad, xaxis=lower.xaxis, ticks=True), width, low_h, colours)
    top_lines = _frame_lines(top)[:-1]  # its bottom edge: the lower's top edge divides
    low_lines = _frame_lines(low)
    low_lines[0] = low_lines[0].replace("┌", "├", 1).replace("┐", "┤", 1)
    return "\n".join([*top_lines, *low_lines])


def _frame_lines(text: str) -> list[str]:
    """The drawing's lines without the empty one plotext ends with."""
    lines = text.split("\n")
    while len(lines) > 1 and not _ANSI.sub("", lines[-1]).strip():
        lines.pop()
    return lines


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _padded(fig: Figure, pad: int, *, xaxis: Axis | None, ticks: bool) -> Figure:
    yaxis = fig.yaxis
    if yaxis is not None:
        yaxis = replace(yaxis, labels=tuple(t.rjust(pad) for t in yaxis.labels))
    if xaxis is not None and not ticks:
        xaxis = replace(xaxis, ticks=(), labels=())
    return replace(fig, yaxis=yaxis, xaxis=xaxis, below=None)


def _draw(fig: Figure, width: int, height: int, colours: Colours) -> str:
    axes = colours.get("axes", (128, 128, 128))
    plt.clf()
    # Without this plotext clips every plot to the terminal it detects, which is 80x24
    # whenever stdout is not a terminal (headless runs, tests), whatever the widget.
    plt.limitsize(False, False)
    plt.plotsize(max(width, 10), max(height, 4))
    # "default" leaves the background alone, so the widget's theme background shows.
    plt.canvas_color("default")
    plt.axes_color("default")
    plt.ticks_color(axes)
    for s in fig.series:
        if not s.xs:
            continue
        colour = colours.get(s.role, axes)
        if s.kind == "scatter":
            plt.scatter(list(s.xs), list(s.ys), color=colour, marker=s.marker or "•")
        else:
            plt.plot(list(s.xs), list(s.ys), color=colour, marker=s.marker or "braille")
    for rule in fig.rules:
        colour = colours.get(rule.role, axes)
        if rule.vertical:
            plt.vline(rule.at, colour)
        else:
            plt.hline(rule.at, colour)
    for note in fig.notes:
        plt.text(note.text, note.x, note.y, color=colours.get(note.role, axes), alignment="left")
    if fig.yaxis is not None:
        plt.ylim(fig.yaxis.lo, fig.yaxis.hi)
        plt.yticks(list(fig.yaxis.ticks), list(fig.yaxis.labels))
    elif fig.ylim is not None:
        plt.ylim(*fig.ylim)
    if fig.xaxis is not None:
        plt.xlim(fig.xaxis.lo, fig.xaxis.hi)
        plt.xticks(list(fig.xaxis.ticks), list(fig.xaxis.labels))
    elif fig.xlim is not None:
        plt.xlim(*fig.xlim)
    if fig.xlabel:
        plt.xlabel(fig.xlabel)
    text = str(plt.build())
    return _label_frame(text, fig.label) if fig.label else text


def _label_frame(text: str, label: str) -> str:
    """`label` written into the top edge of the plot's frame: "┌ TTFT ─────┐".

    plotext draws the edge as one run of "─" after "┌": the label replaces the start of
    that run (never the corners), and is left out where the run is too short for it.
    """
    first, _, rest = text.partition("\n")
    words = f" {label} "
    corner = first.find("┌")
    if corner < 0:
        return text
    start = corner + 1
    if first[start : start + len(words) + 1] != "─" * (len(words) + 1):
        return text
    first = first[:start] + "─" + words + first[start + len(words) + 1 :]
    return first + ("\n" + rest if rest else "")


class PlotRenderer:
    """Draws plot jobs; one place to change if drawing ever moves elsewhere."""

    def __init__(self) -> None:
        self.draws = 0  # how many plots were drawn: tests and the benchmark read it

    async def draw(self, jobs: Sequence[PlotJob]) -> list[str]:
        out: list[str] = []
        for job in jobs:
            await asyncio.sleep(0)  # let input and tokens through before each draw
            out.append(build_plot(job))
            self.draws += 1
        return out
