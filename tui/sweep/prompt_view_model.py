"""The sweep screen's view model: its default lengths, the figures of a sweep as its points
arrive, and the words of its progress (which run, about how long left). Pure functions of
the sweep's points, so a test reads them without a screen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.sweep_result import SweepConfig
from roofline.floors import floor_share_words
from tui import axes
from tui.figures import LOG_LABEL
from tui.plotting import Figure, Series, log10_series
from tui.sweep.overlay import overlay_series

if TYPE_CHECKING:
    from bench.sweep_result import SweepPoint
    from engine.events import ModelCard
    from tui.sweep.overlay import Overlay

KEY = "[$primary]·[/] each run  [$primary]•[/] mean  [$success]▫[/] roofline floor"
KEY_ITL = (
    "[$accent]·[/] each run  [$accent]•[/] median  [$error]•[/] p99  [$success]▫[/] roofline floor"
)
"""The charts' keys, in the glyphs `sweep_figures` draws with (RUN_MARK, MEASURED_MARK,
FLOOR_MARK) and the colours of their roles."""


def default_prompt_lens(card: ModelCard | None, output_len: int) -> tuple[int, ...]:
    """Powers of two that fit both walls with room for the output: the lengths that
    measure something rather than fail."""
    nearest = card.nearest_known_limit if card is not None else None
    if nearest is None:  # no engine yet, or a server that says neither wall
        return SweepConfig().prompt_lens
    limit = nearest - output_len
    lens = [1 << k for k in range(6, 24) if (1 << k) <= limit]
    return tuple(lens[-4:]) or (max(16, limit),)


def parse_lens(text: str) -> tuple[int, ...]:
    """ "512, 1024 2048" -> (512, 1024, 2048); raises ValueError on anything else."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError("no prompt lengths")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class RunPoint:
    """One request of one run, as it finished: plotted before its length is summed up."""

    prompt_len: int
    ttft_ms: float
    median_itl_ms: float | None


MEASURED_MARK = "•"
RUN_MARK = "·"
FLOOR_MARK = "▫"


def sweep_figures(
    points: list[SweepPoint],
    runs: list[RunPoint] | None = None,
    columns: int = 60,
    rows: int = 10,
    overlay: Overlay | None = None,
) -> tuple[Figure | None, Figure | None]:
    """(TTFT vs prompt length, ITL vs prompt length): each run's requests as they finish,
    a loaded sweep's mean TTFT and median ITL (`overlay`), the means and medians of the
    lengths done, and the roofline floors. No two of these share a glyph."""
    runs = runs or []
    good = sorted((p for p in points if p.ok and p.metrics), key=lambda p: p.prompt_len)
    saved_ttft = overlay_series(overlay, "mean_ttft_ms")
    saved_itl = overlay_series(overlay, "median_itl_ms")
    if not good and not runs and not saved_ttft and not saved_itl:
        return None, None
    xs = tuple(float(p.prompt_len) for p in good)

    def series(key: str, role: str, marker: str, kind: str = "line") -> Series | None:
        if not good or not all(p.value(key) is not None for p in good):
            return None
        ys = tuple(p.value(key) or 0.0 for p in good)
        # One point is a line of no length: draw it as a point.
        shape = "scatter" if len(good) == 1 else kind
        return Series(xs, ys, role=role, kind=shape, marker=marker)  # type: ignore[arg-type]

    def run_series(ys: list[tuple[int, float]], role: str) -> Series | None:
        if not ys:
            return None
        return Series(
            tuple(float(x) for x, _ in ys),
            tuple(y for _, y in ys),
            role=role,
            kind="scatter",
            marker=RUN_MARK,
        )

    ttft = [
        s
        for s in (
            run_series([(r.prompt_len, r.ttft_ms) for r in runs], "series"),
            # Under the live means: where both fall on one cell, the live run shows.
            *saved_ttft,
            series("mean_ttft_ms", "series", MEASURED_MARK, "scatter"),
            series("ttft_floor_ms", "p50", FLOOR_MARK, "scatter"),
        )
        if s
    ]
    itl = [
        s
        for s in (
            run_series(
                [(r.prompt_len, r.median_itl_ms) for r in runs if r.median_itl_ms is not None],
                "series-alt",
            ),
            *saved_itl,
            series("median_itl_ms", "series-alt", MEASURED_MARK, "scatter"),
            series("p99_itl_ms", "p99", MEASURED_MARK, "scatter"),
            series("itl_floor_ms", "p50", FLOOR_MARK, "scatter"),
        )
        if s
    ]
    saved_xs = [x for s in (*saved_ttft, *saved_itl) for x in s.xs]
    right = max([*xs, *(float(r.prompt_len) for r in runs), *saved_xs], default=1.0) * 1.05

    def figure(all_series: list[Series]) -> Figure | None:
        if not all_series:
            return None
        values = [y for s in all_series for y in s.ys]
        if axes.ranges_differ([s.ys for s in all_series]):
            # A floor 20x under the measurements, or a p99 spike 15x over the median,
            # would lay the smaller on the zero row of a linear axis: log10, named so.
            return Figure(
                tuple(log10_series(s) for s in all_series),
                xaxis=axes.token_axis(right, columns),
                yaxis=axes.log_duration_axis(min(values), max(values)),
                label=LOG_LABEL,
            )
        return Figure(
            tuple(all_series),
            xaxis=axes.token_axis(right, columns),
            yaxis=axes.duration_axis(max(values), axes.plot_rows(rows, xlabel=False)),
        )

    return figure(ttft), figure(itl)


def floor_cell(point: SweepPoint, key: str) -> str:
    """A "% floor" cell: "43%", "–" without a floor, and "beaten ✗" for a measurement
    faster than its floor (a wrong calibration, never a share over 100%)."""
    words = floor_share_words(point.value(key), short=True)
    return "–" if words == "-" else words


def run_label(done: int, config: SweepConfig) -> str:
    """What the sweep is doing now, from the number of runs done: "512 tok, run 2/3"."""
    if done < config.warmup:
        return f"warm-up {done + 1}/{config.warmup}"
    measured = done - config.warmup
    index = measured // config.runs
    if index >= len(config.prompt_lens):
        return "finishing"
    run = measured % config.runs + 1
    return f"{config.prompt_lens[index]:,} tok, run {run}/{config.runs}"


def eta_seconds(finished_units: list[tuple[int, float]], remaining_lens: list[int]) -> float | None:
    """Time left for runs of `remaining_lens`, from the runs timed so far.

    A run's time grows with its prompt: fit seconds = a + b × tokens through the runs
    done (a flat average while only one length is known), and never less than zero.
    """
    if not remaining_lens:
        return 0.0
    if not finished_units:
        return None
    xs = [float(n) for n, _ in finished_units]
    ys = [t for _, t in finished_units]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var <= 0:
        slope = mean_y / mean_x if mean_x > 0 else 0.0
        base = 0.0
    else:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        base = mean_y - slope * mean_x
    return sum(max(0.0, base + slope * n) for n in remaining_lens)
