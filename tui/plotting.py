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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import plotext as plt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tui.axes import Axis

RGB = tuple[int, int, int]
Palette = tuple[tuple[str, RGB], ...]
"""Colour roles ("series", "axes", "p99", ...) to RGB, taken from the theme by the widget."""


@dataclass(frozen=True)
class Series:
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    role: str = "series"
    kind: Literal["line", "scatter"] = "line"
    marker: str = ""
    """The glyph ("" = a dot for a scatter, braille for a line): series that mean
    different things (measured, floor, queued) must not look alike."""


@dataclass(frozen=True)
class Rule:
    """A reference line: a percentile (horizontal) or a marked event (vertical)."""

    at: float
    role: str
    vertical: bool = False


@dataclass(frozen=True)
class Figure:
    series: tuple[Series, ...]
    rules: tuple[Rule, ...] = ()
    xlabel: str = ""
    ylim: tuple[float, float] | None = None
    xlim: tuple[float, float] | None = None
    xaxis: Axis | None = None
    """Labelled ticks and limits for x; overrides `xlim` (see tui/axes.py)."""
    yaxis: Axis | None = None
    """Labelled ticks and limits for y; overrides `ylim`."""


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
    colours = dict(job.palette)
    axes = colours.get("axes", (128, 128, 128))
    fig = job.figure
    plt.clf()
    # Without this plotext clips every plot to the terminal it detects, which is 80x24
    # whenever stdout is not a terminal (headless runs, tests), whatever the widget.
    plt.limitsize(False, False)
    plt.plotsize(max(job.width, 10), max(job.height, 4))
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
    return str(plt.build())


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
