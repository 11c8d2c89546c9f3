"""A sweep on the terminal: the table of every length, the one-sentence verdict, the charts.

Shared by `kvscope bench` and `bench --compare`, which prints it once per config.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from roofline.floors import FLOOR_BEATEN, floor_beaten, floor_share_words

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from bench.sweep_result import SweepPoint, SweepResult
    from roofline.point_perf import PointPerf, PointRoofline, PointRoofs


def render_summary(result: SweepResult, console: Console) -> None:
    # Every duration in ms, said in each header: one style for the whole table.
    fake = simulated(result.model)
    table = Table(
        title=f"kvscope bench{f' ({SIMULATED})' if fake else ''}: "
        f"{result.config.output_len} output tokens, "
        f"{result.config.runs} run(s), concurrency {result.config.concurrency}"
    )
    for col in (
        "prompt",
        "mean TTFT ms",
        "median TTFT ms",
        "p99 TTFT ms",
        "median ITL ms",
        "p99 ITL ms",
        "mean TPOT ms",
        "E2EL ms",
        "out tok/s",
        "TTFT % floor",
        "ITL % floor",
    ):
        table.add_column(col, justify="right")
    beaten = False
    for p in result.points:
        if not p.ok:
            reason = (p.error or "").split(":")[0]
            table.add_row(f"{p.prompt_len:,}", "[red]failed[/]", f"[red]{reason}[/]", *[""] * 8)
            continue

        def f(key: str, fmt: str = "{:,.1f}", p: SweepPoint = p) -> str:
            v = p.value(key)
            return fmt.format(v) if v is not None else "-"

        shares = [p.value("ttft_pct_of_floor"), p.value("itl_pct_of_floor")]
        beaten = beaten or any(floor_beaten(v) for v in shares)
        table.add_row(
            f"{p.prompt_len:,}",
            f("mean_ttft_ms"),
            f("median_ttft_ms"),
            f("p99_ttft_ms"),
            f("median_itl_ms"),
            f("p99_itl_ms"),
            f("mean_tpot_ms"),
            f("mean_e2el_ms", "{:,.0f}"),
            f("output_throughput"),
            *(_share_cell(v) for v in shares),
        )
    console.print(table)
    render_roofline(
        [(f"{p.prompt_len:,} tokens", p.roofline) for p in result.points if p.ok],
        result.roofs,
        console,
    )
    if beaten:
        console.print(
            f"[red]{FLOOR_BEATEN}[/]: a measurement was faster than its floor, which no "
            "engine can be. The floor's peak numbers are too low for this machine; "
            "measure them again with `kvscope roofline --gpu cpu --recalibrate`."
        )
    ok = [p for p in result.points if p.ok]
    if len(ok) >= 2:
        first, last = ok[0], ok[-1]
        ttft_ratio = (last.value("mean_ttft_ms") or 0.0) / max(
            first.value("mean_ttft_ms") or 0.0, 1e-9
        )
        itl_ratio = (last.value("median_itl_ms") or 0.0) / max(
            first.value("median_itl_ms") or 0.0, 1e-9
        )
        load, cores = host_load()
        if fake:
            console.print(
                f"prompt x{last.prompt_len / first.prompt_len:.0f}: TTFT x{ttft_ratio:.1f}, "
                f"median ITL x{itl_ratio:.2f}. {SCRIPTED}"
            )
        else:
            console.print(
                verdict(
                    last.prompt_len / first.prompt_len,
                    ttft_ratio,
                    itl_ratio,
                    load=load,
                    cores=cores,
                )
            )
        busy = "" if fake else busy_host(load, cores)
        if busy:
            console.print(busy)
        console.file.write(charts(result, width=min(console.width, 100)) + "\n")


def render_roofline(
    rows: Sequence[tuple[str, PointRoofline | None]],
    roofs: PointRoofs | str | None,
    console: Console,
) -> None:
    """Each point on the roofline: the FLOP/s and bytes/s it achieved, its intensity, and
    its share of the roof that binds it (in-process, its prefill and decode steps apart);
    or, where the engine counted nothing, which flag gives the figures. Nothing where the
    points carry no roofline (a result from before it)."""
    from roofline.point_perf import PointRoofs, roof_share
    from tui.roofline_figure import si

    shown = [(label, r) for label, r in rows if r is not None]
    if not shown:
        return
    known = roofs if isinstance(roofs, PointRoofs) else None
    sources = sorted({r.whole.source for _, r in shown if r.whole is not None})
    title = "Roofline per point" + (f" (counted by {', '.join(sources)})" if sources else "")
    if known is not None:
        title += (
            f": roofs {known.name}, {si(known.peak_flops, ' ')}FLOP/s, "
            f"{si(known.bandwidth, ' ')}B/s, ridge {known.ridge:,.1f} FLOP/byte"
        )
    # No vertical rules: it reads apart from the latency table above it, whose rows
    # scripts pick by their first cell.
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in ("point", "steps", "counted", "FLOP/s", "GB/s", "FLOP/byte", "roof", "of roof"):
        table.add_column(col, justify="right")
    missing: list[str] = []
    above = False

    def add(label: str, part: str, perf: PointPerf) -> None:
        nonlocal above
        share = roof_share(perf, known) if known is not None else None
        if share is None:
            roof, of_roof = "-", "-"
        elif share.above:
            above = True
            roof, of_roof = share.binding, "[red]above: calibration problem[/]"
        else:
            roof, of_roof = share.binding, f"{100 * share.share:.0f} %"
        intensity = perf.intensity
        table.add_row(
            label,
            part,
            f"{perf.counted:,} of {perf.of:,} {perf.unit}",
            si(perf.flops_per_s),
            f"{perf.bytes_per_s / 1e9:,.2f}",
            f"{intensity:,.2f}" if intensity is not None else "-",
            roof,
            of_roof,
        )

    for label, r in shown:
        if r.whole is None:
            table.add_row(label, "-", "none", *["-"] * 5)
            if r.missing not in missing:
                missing.append(r.missing)
            continue
        add(label, "all", r.whole)
        for kind, perf in r.by_kind:
            add("", kind, perf)
    console.print(table)
    for why in missing:
        console.print(f"No FLOP or byte counts: {why}.", markup=False, highlight=False)
    if isinstance(roofs, str):
        console.print(f"No share of a roof: {roofs}.", markup=False, highlight=False)
    if above:
        console.print(
            "[red]A point above a roof[/] cannot be: the roofs are too low for this machine "
            "or the counts are wrong; measure the roofs again with "
            "`kvscope roofline --gpu cpu --recalibrate` (on a GPU, check --hardware)."
        )
    if any(r.whole is not None and r.whole.unit == "scrape windows" for _, r in shown):
        console.print(
            "Attached: each point's figures are the server's counter deltas over the scrape "
            "windows it ran in (all its requests, idle moments included), not its steps."
        )


def _share_cell(percent: float | None) -> str:
    words = floor_share_words(percent, short=True)
    return f"[red]{words}[/]" if floor_beaten(percent) else words


FLAT = 1.5
"""ITL counts as flat while the longest prompt's median is within 1.5x of the shortest's,
either way: a fall is as much a move as a rise."""


def _moved(ratio: float) -> float:
    """How far a ratio is from 1, either way: x0.18 moved 5.5x, as x5.5 did."""
    if ratio <= 0:
        return float("inf")
    return max(ratio, 1.0 / ratio)


def verdict(
    prompt_ratio: float,
    ttft_ratio: float,
    itl_ratio: float,
    *,
    load: float | None = None,
    cores: int | None = None,
) -> str:
    """What the sweep's own numbers show, in one sentence: never a fixed text.

    `load` and `cores` are the host's load average and core count while it measured:
    on a busy host a moving ITL is the host's doing, and the sentence says so rather
    than read it as the engine's.
    """
    head = f"prompt x{prompt_ratio:.0f}: TTFT x{ttft_ratio:.1f}, median ITL x{itl_ratio:.2f}. "
    ttft_grew = ttft_ratio >= max(1.5, 0.5 * prompt_ratio)
    moved = _moved(itl_ratio)
    itl_flat = moved <= FLAT
    busy = load is not None and cores is not None and load > cores
    host = f"the host was busy (load {load:.1f} on {cores} cores)" if busy else ""
    if ttft_grew and itl_flat:
        tail = f" (on a busy host: load {load:.1f} on {cores} cores)" if busy else ""
        return head + (
            f"TTFT grew with the prompt while ITL stayed within {moved:.1f}x: prefill is "
            f"compute-bound and decode memory-bound, as in the reference article{tail}."
        )
    if not itl_flat and busy:
        prefill = (
            "TTFT grew with the prompt, but "
            if ttft_grew
            else "TTFT grew less than the prompt and "
        )
        return head + (
            f"{prefill}ITL moved {moved:.1f}x: {host}, so this run cannot show the decode "
            "claim. Measure again on a quiet host."
        )
    if not itl_flat and itl_ratio < 1:
        return head + (
            f"ITL fell {moved:.1f}x as the prompt grew, which a longer prompt cannot "
            "cause: something slowed the shorter runs (a warm-up, another process), so "
            "this run cannot show the decode claim. Measure again."
        )
    if ttft_grew:
        return head + (
            f"TTFT grew with the prompt, but ITL grew too ({moved:.1f}x): decode is not "
            "flat here (long contexts reading more KV, or a busy host slowing some steps)."
        )
    if itl_flat:
        return head + (
            f"TTFT grew less than the prompt (x{ttft_ratio:.1f} for x{prompt_ratio:.0f} "
            "the tokens): fixed costs (a network round trip, a small model, queueing) "
            "outweigh the prefill itself at these lengths."
        )
    return head + (
        f"Neither finding shows clearly in these numbers (TTFT x{ttft_ratio:.1f} for "
        f"x{prompt_ratio:.0f} the tokens, ITL moved {moved:.1f}x); a busy host is likely."
    )


def host_load() -> tuple[float | None, int]:
    """The host's 1-minute load average (None where it cannot be read) and its cores."""
    cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except (AttributeError, OSError):
        return None, cores


SIMULATED = "fake engine, simulated timings"
"""Said in the title of every run on `--fake`: its timings are the fake's script."""
SCRIPTED = (
    "These timings are the fake engine's script (--fake): they show how kvscope reads a "
    "run, and say nothing about this machine."
)


def simulated(model: dict[str, Any] | None) -> bool:
    """Whether the run's engine was the fake: no sentence about this machine's hardware or
    load may be drawn from its timings."""
    return model is not None and model.get("device") == "fake"


def busy_host(load: float | None = None, cores: int | None = None) -> str:
    """A warning when this machine was busier than its cores while measuring, else ""."""
    if load is None or cores is None:
        load, cores = host_load()
    if load is None or load <= cores:
        return ""
    return (
        f"Note: this host was busy while measuring (load {load:.1f} on {cores} cores): "
        "other work shared the CPU, so the ratios are noisy. Measure again on a quiet host."
    )


def charts(result: SweepResult, width: int = 100, height: int = 14) -> str:
    import plotext as plt

    ok = [p for p in result.points if p.ok]
    xs = [p.prompt_len for p in ok]
    out = []
    for key, floor_key, title in (
        ("mean_ttft_ms", "ttft_floor_ms", "TTFT (ms) vs prompt length"),
        ("median_itl_ms", "itl_floor_ms", "median ITL (ms) vs prompt length"),
    ):
        plt.clf()
        plt.plotsize(width, height)
        plt.theme("clear")
        measured = [p.value(key) or 0.0 for p in ok]
        plt.plot(xs, measured, marker="braille", label="measured")
        floors = [p.value(floor_key) for p in ok]
        shown = [v for v in floors if v is not None]
        log = False
        if shown and len(shown) == len(floors):
            # Another glyph than the measurement's: the charts are often read without colour.
            plt.plot(xs, shown, marker="x", label="floor")
            # A floor 20x under the measurement would lie on a linear axis' zero row.
            log = min(shown) > 0 and min(measured) > 0 and _apart(measured, shown)
        if log:
            plt.yscale("log")
            plt.title(f"{title}, log scale")
        else:
            plt.title(title)
            plt.ylim(0, None)
        out.append(plt.build())
    # Plain text: the charts go to files and pipes as often as to terminals.
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out))


def _apart(a: list[float], b: list[float], factor: float = 10.0) -> bool:
    """Whether the tops of two series differ by more than `factor`."""
    top_a, top_b = max(a), max(b)
    return max(top_a, top_b) / max(min(top_a, top_b), 1e-9) > factor
