"""A load run on the terminal: one row per load level, and the sentence its numbers say."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from cli.sweep_table import busy_host

if TYPE_CHECKING:
    from rich.console import Console

    from bench.load_result import LoadPoint, LoadResult


def render_load(result: LoadResult, console: Console) -> None:
    c = result.config
    spread = f" ±{c.range_ratio:.0%}" if c.range_ratio else ""
    table = Table(
        title=f"kvscope bench: load, {c.prompt_len:,}{spread}-token prompts, "
        f"{c.output_len:,} output tokens, seed {c.seed}"
    )
    goodput = bool(c.goodput)
    roofline = any(p.roofline_output_throughput is not None for p in result.points)
    cols = ["load", "done", "req/s", "out tok/s", "total tok/s"]
    cols += ["mean TTFT ms", "p99 TTFT ms", "median ITL ms", "p99 ITL ms", "mean TPOT ms"]
    cols += ["mean E2EL ms", "batch mean/max", "queue max", "KV max", "prefill %"]
    cols += ["sched err p99 ms"]
    if goodput:
        cols.append("goodput req/s")
    if roofline:
        cols.append("roofline tok/s")
    for col in cols:
        table.add_column(col, justify="right")
    for p in result.points:
        if not p.ok:
            table.add_row(p.label, "[red]failed[/]", f"[red]{(p.error or '')[:40]}[/]")
            continue
        s = p.steps
        row = [
            p.label,
            f"{p.completed}" + (f"+{p.aborted}✗" if p.aborted else ""),
            f"{p.request_throughput:,.2f}",
            f"{p.output_throughput:,.1f}",
            f"{p.total_token_throughput:,.1f}",
            f"{p.mean_ttft_ms:,.1f}",
            f"{p.p99_ttft_ms:,.1f}",
            f"{p.median_itl_ms:,.1f}",
            f"{p.p99_itl_ms:,.1f}",
            f"{p.mean_tpot_ms:,.1f}",
            f"{p.mean_e2el_ms:,.0f}",
            f"{s.mean_running:.1f}/{s.max_running}" if s else "-",
            f"{s.max_waiting}" if s else "-",
            f"{s.max_kv_usage:.0%}" if s else "-",
            f"{s.prefill_time_share:.0%}" if s and s.prefill_time_share is not None else "-",
            _opt(p.schedule_error_p99_ms, "{:,.1f}"),
        ]
        if goodput:
            row.append(_opt(p.request_goodput, "{:,.2f}"))
        if roofline:
            row.append(_opt(p.roofline_output_throughput, "{:,.0f}"))
        table.add_row(*row)
    console.print(table)
    for p in result.points:
        for note in p.notes:
            console.print(f"{p.label}: {note}")
    console.print(verdict(result.points, roofline=roofline))
    if result.find_max:
        console.print(str(result.find_max.get("sentence", "")))
    busy = busy_host()
    if busy:
        console.print(busy)
    console.print(f"Prompts were drawn from seed {c.seed}: --seed {c.seed} repeats them.")


def verdict(points: list[LoadPoint], *, roofline: bool = False) -> str:
    """What the load's own numbers show, in one sentence: never a fixed text."""
    ok = [p for p in points if p.ok and p.completed and p.output_throughput > 0]
    if len(ok) < 2:
        return "One measured point: nothing to compare."
    users = [p for p in ok if p.max_concurrency is not None and p.request_rate is None]
    if len(users) >= 2:
        first, last = users[0], users[-1]
        load = f"concurrency x{last.level / max(first.level, 1):g}"
    else:
        first, last = ok[0], ok[-1]
        load = f"{first.label} -> {last.label}"
    thr = last.output_throughput / first.output_throughput
    itl = last.median_itl_ms / max(first.median_itl_ms, 1e-9)
    ttft = last.mean_ttft_ms / max(first.mean_ttft_ms, 1e-9)
    head = f"{load}: output throughput x{thr:.1f}, median ITL x{itl:.2f}, mean TTFT x{ttft:.1f}. "
    stopped = [p for p in ok if p.stopped_early]
    if stopped:
        return head + (
            f"Past {stopped[0].label} the engine could not keep up (the point stopped "
            "early, over-saturated): that is the knee."
        )
    if thr >= 1.5 and itl < thr:
        return head + (
            "Throughput grew faster than ITL: the batch shares each step's pass over the "
            "weights, so decode is memory-bound here"
            + (", as the roofline's ceiling says." if roofline else ".")
        )
    if thr < 1.2:
        return head + (
            "Throughput did not grow with the load: the engine was already saturated (or "
            "the host busy); TTFT is where the extra load went."
        )
    return head + "ITL grew as fast as throughput: each step got dearer with the batch."


def _opt(value: float | None, fmt: str) -> str:
    return fmt.format(value) if value is not None else "-"
