"""A load run on the terminal: one row per load level, and the sentence its numbers say;
and a multi-turn chat run, alone or one row per router policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from cli.sweep_table import SCRIPTED, SIMULATED, busy_host, render_roofline, simulated

if TYPE_CHECKING:
    from rich.console import Console

    from bench.load_result import LoadPoint, LoadResult
    from bench.multi_turn import MultiTurnConfig, MultiTurnResult
    from bench.policy_compare import PolicyComparison


def render_load(result: LoadResult, console: Console) -> None:
    c = result.config
    spread = f" ±{c.range_ratio:.0%}" if c.range_ratio else ""
    fake = simulated(result.model)
    table = Table(
        title=f"kvscope bench{f' ({SIMULATED})' if fake else ''}: load, "
        f"{c.prompt_len:,}{spread}-token prompts, {c.output_len:,} output tokens, seed {c.seed}"
    )
    goodput = bool(c.goodput)
    roofline = any(p.roofline_output_throughput is not None for p in result.points)
    cols = ["load", "done", "failed", "req/s", "out tok/s", "total tok/s"]
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
        if not p.ok and not p.completed:
            # Nothing to measure: the line under the table says why.
            failed = f"{p.failed} of {p.sent}" if p.failed else "-"
            table.add_row(p.label, "0", f"[red]{failed}[/]", *["-"] * (len(cols) - 3))
            continue
        s = p.steps
        row = [
            p.label,
            f"{p.completed}" + (f"+{p.aborted}✗" if p.aborted else ""),
            f"[red]{p.failed} of {p.sent}[/]" if p.failed else f"0 of {p.sent}",
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
    render_roofline([(p.label, p.roofline) for p in result.points], result.roofs, console)
    for p in result.points:
        if not p.ok and not p.completed:
            console.print(f"{p.label}: failed: {p.error}", markup=False, highlight=False)
        for note in p.notes:
            console.print(f"{p.label}: {note}", markup=False, highlight=False)
    console.print(verdict(result.points, roofline=roofline, scripted=fake))
    if result.find_max:
        console.print(str(result.find_max.get("sentence", "")))
    busy = "" if fake else busy_host()
    if busy:
        console.print(busy)
    console.print(f"Prompts were drawn from seed {c.seed}: --seed {c.seed} repeats them.")


def verdict(points: list[LoadPoint], *, roofline: bool = False, scripted: bool = False) -> str:
    """What the load's own numbers show, in one sentence: never a fixed text. Failures
    come first: a point where requests failed measured the server's errors, not its
    capacity, so it is named and left out of the comparison (it is never "saturation").
    `scripted`: the fake engine's run: the ratios, and no word on what bounds this machine."""
    failures = failure_sentence(points)
    return failures + _compare(points, roofline=roofline, scripted=scripted)


def failure_sentence(points: list[LoadPoint]) -> str:
    """Failed requests and points, named before anything is concluded; "" when none."""
    said = []
    for p in points:
        if p.failed:
            said.append(f"{p.label}: {p.failure_words()}")
        elif not p.ok:
            said.append(f"{p.label}: the point failed")
    if not said:
        return ""
    total = sum(p.failed for p in points)
    what = f"{total:,} request{'' if total == 1 else 's'} failed" if total else "Points failed"
    return (
        f"{what}, so those points measured the failures, not the engine "
        f"({'; '.join(said)}); they are left out of the comparison. "
    )


def _compare(points: list[LoadPoint], *, roofline: bool, scripted: bool = False) -> str:
    ok = [p for p in points if p.ok and p.completed and p.output_throughput > 0]
    after = f" {SCRIPTED}" if scripted else ""
    if len(ok) < 2:
        if not ok and points:
            return "No point ran clean: nothing to compare." + after
        return "One measured point: nothing to compare." + after
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
    if scripted:
        return head + SCRIPTED
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


# -- multi-turn chats (`bench --turns N --sessions M`) ---------------------------------------
def _hit(rate: float | None) -> str:
    return f"{rate:.0%}" if rate is not None else "-"


def _chat_title(config: MultiTurnConfig) -> str:
    return (
        f"kvscope bench: {config.sessions} chat session(s) x {config.turns} turn(s), "
        f"{config.message_len:,}-word messages, {config.output_len:,}-token replies, "
        f"seed {config.seed}"
    )


def render_multi_turn(result: MultiTurnResult, console: Console) -> None:
    """One row per turn index, then turns 2+ and all: TTFT, prompt, cached, hit rate."""
    c = result.config
    table = Table(title=_chat_title(c))
    for col in ("turn", "done", "mean TTFT ms", "p50 TTFT ms", "p90 TTFT ms"):
        table.add_column(col, justify="right")
    for col in ("prompt tok (mean)", "cached tok (mean)", "prefix hit"):
        table.add_column(col, justify="right")
    later = result.later()
    rows = [*result.by_turn(), *([later] if later else []), result.overall()]
    for s in rows:
        done = f"{s.requests}" + (f"+{s.failed}✗" if s.failed else "")
        n = max(s.requests, 1)
        cached = f"{s.cached_prompt_tokens / n:,.0f}" if s.cached_prompt_tokens is not None else "-"
        table.add_row(
            s.turns,
            done,
            _opt(s.mean_ttft_ms, "{:,.0f}"),  # "-": no turn of these finished
            _opt(s.median_ttft_ms, "{:,.0f}"),
            _opt(s.p90_ttft_ms, "{:,.0f}"),
            f"{s.prompt_tokens / n:,.0f}" if s.requests else "-",
            cached,
            _hit(s.hit_rate),
        )
    console.print(table)
    if result.not_sent:
        planned = c.sessions * c.turns
        console.print(
            f"{result.not_sent} of {planned} planned turns were never sent: a session ends "
            "at its first turn that failed, as the next turn needs its reply."
        )
    console.print(
        f"{result.completed} turns in {result.duration_s:,.1f} s: "
        f"{result.request_throughput:,.2f} req/s, {result.output_throughput:,.1f} output tok/s."
    )
    if result.overall().hit_rate is None:
        console.print(
            "The engine did not say how many prompt tokens it found cached (a vLLM server "
            "says so with --enable-prompt-tokens-details --enable-per-request-metrics)."
        )
    busy = busy_host()
    if busy:
        console.print(busy)
    console.print(f"Messages were drawn from seed {c.seed}: --seed {c.seed} repeats them.")


# Past this many turns, the policy table shows the first ones and then one span.
MAX_TURN_COLUMNS = 6


def render_policy_compare(done: PolicyComparison, console: Console) -> None:
    """One row per policy: TTFT (and hit rate) by turn, turns 2+, throughput; then what
    the numbers show."""
    from bench.multi_turn import TurnSummary
    from bench.policy_compare import verdict

    c = done.config
    table = Table(title=_chat_title(c).replace("kvscope bench:", "kvscope bench: routing,"))
    table.add_column("policy", justify="left")
    table.add_column("done", justify="right")
    spans: list[tuple[str, range]] = []
    if c.turns <= MAX_TURN_COLUMNS:
        spans = [(f"turn {t}", range(t, t + 1)) for t in range(1, c.turns + 1)]
    else:
        spans = [(f"turn {t}", range(t, t + 1)) for t in range(1, MAX_TURN_COLUMNS)]
        spans.append((f"turns {MAX_TURN_COLUMNS}-{c.turns}", range(MAX_TURN_COLUMNS, c.turns + 1)))
    for name, _ in spans:
        table.add_column(f"{name}\nTTFT ms · hit", justify="right", no_wrap=True)
    later = "turns 2+" if c.turns > 1 else "all turns"
    for col in (f"{later}\nmean TTFT ms", f"{later}\np90 TTFT ms", f"{later}\nprefix hit"):
        table.add_column(col, justify="right")
    for col in ("all\nprefix hit", "out tok/s", "req/s"):
        table.add_column(col, justify="right")
    for name in done.urls:
        r = done.results.get(name)
        if r is None:
            why = done.failed.get(name, "not measured")
            table.add_row(name, "[red]failed[/]", f"[red]{why[:60]}[/]")
            continue
        cells = []
        for label, turns in spans:
            s = TurnSummary.of(label, [x for x in r.records if x.turn in turns])
            ttft = s.mean_ttft_ms
            cells.append(f"{ttft:,.0f} · {_hit(s.hit_rate)}" if ttft is not None else "-")
        tail = r.later() or r.overall()
        table.add_row(
            name,
            f"{r.completed}" + (f"+{r.failed}✗" if r.failed else ""),
            *cells,
            _opt(tail.mean_ttft_ms, "{:,.0f}"),
            _opt(tail.p90_ttft_ms, "{:,.0f}"),
            _hit(tail.hit_rate),
            _hit(r.overall().hit_rate),
            f"{r.output_throughput:,.1f}",
            f"{r.request_throughput:,.2f}",
        )
    console.print(table)
    for name, url in done.urls.items():
        console.print(f"{name}: {url}", markup=False, highlight=False)
    console.print(verdict(done), markup=False, highlight=False)
    busy = busy_host()
    if busy:
        console.print(busy)
    console.print(
        "Each policy ran its own sessions (no run finds another's turns cached); "
        f"messages were drawn from seed {c.seed}: --seed {c.seed} repeats them."
    )
