"""A sweep on the terminal: the table of every length, the one-sentence verdict, the charts.

Shared by `kvscope bench` and `bench --compare`, which prints it once per config.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console

    from bench.sweep_result import SweepPoint, SweepResult


def render_summary(result: SweepResult, console: Console) -> None:
    table = Table(
        title=f"kvscope bench: {result.config.output_len} output tokens, "
        f"{result.config.runs} run(s), concurrency {result.config.concurrency}"
    )
    for col in (
        "prompt",
        "mean TTFT ms",
        "median TTFT",
        "p99 TTFT",
        "median ITL ms",
        "p99 ITL",
        "mean TPOT",
        "E2EL ms",
        "out tok/s",
        "TTFT % floor",
        "ITL % floor",
    ):
        table.add_column(col, justify="right")
    for p in result.points:
        if not p.ok:
            reason = (p.error or "").split(":")[0]
            table.add_row(f"{p.prompt_len:,}", "[red]failed[/]", f"[red]{reason}[/]", *[""] * 8)
            continue

        def f(key: str, fmt: str = "{:.1f}", p: SweepPoint = p) -> str:
            v = p.value(key)
            return fmt.format(v) if v is not None else "-"

        table.add_row(
            f"{p.prompt_len:,}",
            f("mean_ttft_ms"),
            f("median_ttft_ms"),
            f("p99_ttft_ms"),
            f("median_itl_ms"),
            f("p99_itl_ms"),
            f("mean_tpot_ms"),
            f("mean_e2el_ms", "{:.0f}"),
            f("output_throughput"),
            f("ttft_pct_of_floor", "{:.0f}%"),
            f("itl_pct_of_floor", "{:.0f}%"),
        )
    console.print(table)
    ok = [p for p in result.points if p.ok]
    if len(ok) >= 2:
        first, last = ok[0], ok[-1]
        ttft_ratio = (last.value("mean_ttft_ms") or 0.0) / max(
            first.value("mean_ttft_ms") or 0.0, 1e-9
        )
        itl_ratio = (last.value("median_itl_ms") or 0.0) / max(
            first.value("median_itl_ms") or 0.0, 1e-9
        )
        console.print(verdict(last.prompt_len / first.prompt_len, ttft_ratio, itl_ratio))
        busy = busy_host()
        if busy:
            console.print(busy)
        console.file.write(charts(result, width=min(console.width, 100)) + "\n")


def verdict(prompt_ratio: float, ttft_ratio: float, itl_ratio: float) -> str:
    """What the sweep's own numbers show, in one sentence: never a fixed text."""
    head = f"prompt x{prompt_ratio:.0f}: TTFT x{ttft_ratio:.1f}, median ITL x{itl_ratio:.2f}. "
    ttft_grew = ttft_ratio >= max(1.5, 0.5 * prompt_ratio)
    itl_flat = itl_ratio <= 1.5
    if ttft_grew and itl_flat:
        return head + (
            "TTFT grew with the prompt while ITL stayed nearly flat: prefill is "
            "compute-bound and decode memory-bound, as in the reference article."
        )
    if ttft_grew:
        return head + (
            "TTFT grew with the prompt, but ITL grew too: decode is not flat here (long "
            "contexts, or a busy host slowing some steps)."
        )
    if itl_flat:
        return head + (
            "TTFT grew less than the prompt: fixed costs (a network round trip, a small "
            "model, queueing) outweigh the prefill itself at these lengths."
        )
    return head + "Neither finding shows clearly in these numbers; a busy host is likely."


def busy_host() -> str:
    """A warning when this machine was busier than its cores while measuring, else ""."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load <= cores:
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
        plt.plot(xs, [p.value(key) or 0.0 for p in ok], marker="braille", label="measured")
        if all(p.value(floor_key) is not None for p in ok):
            # Another glyph than the measurement's: the charts are often read without colour.
            plt.plot(xs, [p.value(floor_key) or 0.0 for p in ok], marker="x", label="floor")
        plt.title(title)
        plt.ylim(0, None)
        out.append(plt.build())
    # Plain text: the charts go to files and pipes as often as to terminals.
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out))
