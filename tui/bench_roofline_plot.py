"""Bench points under the roofs, as plain text: `kvscope roofline --plot FILE` and the
sweep screen's roofline view (F3) draw the same plot from the same rows.

No Textual here: the CLI draws it to a pipe as often as to a terminal.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from bench.load_result import LoadPoint
    from bench.sweep_files import SavedLoad, SavedSweep
    from bench.sweep_result import SweepPoint
    from roofline.point_perf import PointRoofline, PointRoofs

RooflineRow = tuple[str, "PointRoofline | None"]
"""One bench point: its label ("512 tokens", "8 users") and its roofline figures (None: a
result written before kvscope counted them)."""

PLOT_MARKS = {"prefill": "■", "decode": "●", "point": "◆"}
"""Each kind its own glyph, as on the live panel, so they read apart without colour."""
ABOVE_MARK = "!"

NO_FIGURES = (
    "its points carry no roofline figures (a bench result written before kvscope counted "
    "them): measure again with `kvscope bench --json FILE`"
)


def sweep_rows(points: Iterable[SweepPoint], head: str = "") -> list[RooflineRow]:
    """A prompt-length sweep's measured points, labelled by length (after `head`)."""
    return [(f"{head}{p.prompt_len:,} tokens", p.roofline) for p in points if p.ok]


def load_rows(points: Iterable[LoadPoint]) -> list[RooflineRow]:
    """A load sweep's points that measured something (a level with failures still did)."""
    return [(p.label, p.roofline) for p in points if p.ok or p.completed]


def saved_rows(
    saved: SavedLoad | Sequence[SavedSweep],
) -> tuple[list[RooflineRow], PointRoofs | str | None]:
    """A saved bench result's rows and the roofs it was measured against (a compare
    file's configs each labelled "A: ", "B: "; the first config's roofs that are known)."""
    from bench.sweep_files import SavedLoad

    if isinstance(saved, SavedLoad):
        return load_rows(saved.result.points), saved.result.roofs
    rows: list[RooflineRow] = []
    roofs: PointRoofs | str | None = None
    for s in saved:
        rows += sweep_rows(s.result.points, f"{s.label}: " if s.label else "")
        roofs = roofs if roofs is not None else s.result.roofs
    return rows, roofs


def undrawable(rows: Sequence[RooflineRow]) -> str | None:
    """Why none of `rows` can be drawn, in words; None when at least one point has FLOP
    and byte counts."""
    known = [r for _, r in rows if r is not None]
    if not known:
        return NO_FIGURES
    if all(r.whole is None for r in known):
        return f"no point has FLOP and byte counts: {known[0].missing}"
    return None


def roofline_plot(
    rows: Sequence[RooflineRow],
    roofs: PointRoofs | None,
    width: int = 100,
    height: int = 24,
) -> str:
    """The points on log-log axes (FLOP/byte, FLOP/s) under the two roofs and the ridge,
    as plain text: in-process points as their prefill and decode parts, attached ones
    whole; one above its roof drawn as "!". "" when no point has counts."""
    import plotext as plt

    from roofline.point_perf import roof_share
    from tui.roofline_figure import si

    # Drawn in log10 units with decade ticks of our own: plotext's log scale overflows on
    # FLOP counts (10^12 and up).
    marks: dict[str, tuple[list[float], list[float]]] = {}
    for _, r in rows:
        if r is None or r.whole is None:
            continue
        for kind, perf in r.by_kind or (("point", r.whole),):
            x = perf.intensity
            if x is None or x <= 0 or perf.flops_per_s <= 0:
                continue
            share = roof_share(perf, roofs) if roofs is not None else None
            key: str = "above a roof" if share is not None and share.above else kind
            xs, ys = marks.setdefault(key, ([], []))
            xs.append(math.log10(x))
            ys.append(math.log10(perf.flops_per_s))
    all_x = [x for xs, _ in marks.values() for x in xs]
    all_y = [y for _, ys in marks.values() for y in ys]
    if not all_x:
        return ""
    x_lo, x_hi = min(all_x) - 0.3, max(all_x) + 0.3
    y_lo, y_hi = min(all_y) - 0.3, max(all_y) + 0.3
    # plotext keeps one global figure; every draw in kvscope runs on one thread (see
    # tui.plotting), so clearing it first is enough.
    plt.clf()
    plt.plotsize(width, height)
    plt.theme("clear")
    if roofs is not None:
        ridge, peak, bw = (math.log10(v) for v in (roofs.ridge, roofs.peak_flops, roofs.bandwidth))
        x_lo, x_hi = min(x_lo, ridge - 0.6), max(x_hi, ridge + 0.6)
        y_hi = max(y_hi, peak + 0.3)
        # The slope from where it enters the plot to the ridge, then the flat roof.
        start = max(x_lo, y_lo - bw)
        plt.plot(
            [start, ridge, x_hi],
            [start + bw, peak, peak],
            marker="braille",
            label=f"roofs: {roofs.name}",
        )
        plt.vline(ridge)
        plt.text("ridge", ridge, peak + 0.15)
    for key, (xs, ys) in marks.items():
        plt.scatter(xs, ys, marker=PLOT_MARKS.get(key, ABOVE_MARK), label=key)
    x_lo, x_hi, y_lo, y_hi = math.floor(x_lo), math.ceil(x_hi), math.floor(y_lo), math.ceil(y_hi)
    plt.xlim(x_lo, x_hi)
    plt.ylim(y_lo, y_hi)
    xt = list(range(x_lo, x_hi + 1))
    yt = list(range(y_lo, y_hi + 1))
    plt.xticks(xt, [si(10.0**k) for k in xt])
    plt.yticks(yt, [si(10.0**k) for k in yt])
    plt.xlabel("FLOP/byte (arithmetic intensity), log")
    plt.ylabel("FLOP/s, log")
    title = "Roofline: each bench point under the roofs"
    if roofs is not None:
        title += f" · ridge {roofs.ridge:,.1f} FLOP/byte"
    plt.title(title)
    # Plain text: it goes to files and pipes as often as to terminals.
    return re.sub(r"\x1b\[[0-9;]*m", "", plt.build())
