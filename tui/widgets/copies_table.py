"""The extra concurrent copies of a request: each one's state, and, once all are over,
one table of them (a row each, or min / median / max rows when there are many)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.table import Table

from engine.stats import percentile
from tui import format as fmt
from tui.widgets.reply_footer import REASONS, footer_line

if TYPE_CHECKING:
    from engine.events import RequestFinished
    from tui.telemetry.request_status import RequestStatus

PER_COPY_ROWS = 3
"""Up to this many extra copies get a line each; more are counted and summed up."""


@dataclass
class CopyState:
    """One of the request's concurrent copies, as the reply sees it."""

    request_id: str
    received: int = 0
    accepted: bool = False
    finished: RequestFinished | None = None
    error: str | None = None
    preemptions_seen: int = 0

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    def status(self, where: RequestStatus) -> str:
        if self.error is not None:
            return f"{self.request_id} · failed: {self.error}"
        if self.finished is not None:
            return f"{self.request_id} · {footer_line(self.finished)}"
        tokens = f" · {fmt.count(self.received, 'token')}" if self.received else ""
        return f"{self.request_id} · {where.words}{tokens}"


def _num_ms(seconds: float | None) -> str:
    """Milliseconds as a bare number for a table whose header carries the unit."""
    if seconds is None:
        return "–"
    value = seconds * 1000.0
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _ended(copy: CopyState) -> str:
    if copy.finished is None:
        return f"failed: {copy.error}"
    return REASONS.get(copy.finished.reason, copy.finished.reason)


def copies_table(copies: list[CopyState]) -> tuple[Table, list[str]]:
    """The finished extra copies as one table (and its lines as plain text).

    A few copies get a row each. Many (16 copies of a synthetic prompt) are summed up as
    min / median / max rows, so they do not flood the transcript with footers. Units are
    in the header, so every cell stays on one line in a narrow chat column.
    """
    per_copy = len(copies) <= PER_COPY_ROWS
    # Narrow on purpose: the chat column is about 55 cells at 160x48 and 76 at 80x24, and
    # a table wider than that is squeezed by rich into "… TTF… p5…". How the copies
    # ended goes in a column only when they ended differently; preemptions get a short
    # column of their own; the rest is said in the title line, which wraps.
    table = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold")
    ended_all = {_ended(c) for c in copies}
    any_preempted = any(c.finished is not None and c.finished.preemptions for c in copies)
    names = ["copy" if per_copy else "", "TTFT ms", "p50 ms", "p99 ms", "tok/s", "out"]
    if per_copy and any_preempted:
        names.append("preempted")
    if per_copy and len(ended_all) > 1:
        names.append("ended")
    for name in names:
        table.add_column(
            name, justify="left" if name in ("copy", "", "ended") else "right", no_wrap=True
        )
    plain: list[str] = []
    finished = [c.finished for c in copies if c.finished is not None]

    def metrics(ev: RequestFinished) -> tuple[float | None, float | None, float | None, float]:
        itl = list(ev.itl_s)
        rate = ev.output_tokens / ev.e2e_s if ev.e2e_s > 0 else 0.0
        p50 = percentile(itl, 50) if itl else None
        p99 = percentile(itl, 99) if itl else None
        return ev.ttft_s, p50, p99, rate

    if per_copy:
        for c in copies:
            if c.finished is None:
                blank = [""] * (len(names) - 1)
                if len(ended_all) > 1:
                    blank[-1] = _ended(c)
                table.add_row(c.request_id, *blank)
                plain.append(f"{c.request_id} · failed: {c.error}")
                continue
            ttft, p50, p99, rate = metrics(c.finished)
            cells = [
                c.request_id,
                _num_ms(ttft),
                _num_ms(p50),
                _num_ms(p99),
                f"{rate:,.1f}",
                f"{c.finished.output_tokens:,}",
            ]
            if any_preempted:
                n = c.finished.preemptions
                cells.append(f"×{n}" if n else "")
            if len(ended_all) > 1:
                cells.append(_ended(c))
            table.add_row(*cells)
            plain.append(f"{c.request_id} · {footer_line(c.finished)}")
        if len(ended_all) == 1 and copies:
            words = f"{fmt.count(len(copies), 'more copy', 'more copies')}: " + (
                f"each {next(iter(ended_all))}" if len(copies) > 1 else next(iter(ended_all))
            )
            table.title = words
            table.title_justify = "left"
            table.title_style = "italic"
            plain.insert(0, words)
        return table, plain

    values = [metrics(ev) for ev in finished]

    def column(i: int) -> list[float]:
        return [float(v[i]) for v in values if v[i] is not None]  # type: ignore[arg-type]

    outs = [ev.output_tokens for ev in finished]
    for label, pct in (("min", 0.0), ("median", 50.0), ("max", 100.0)):

        def pick(xs: list[float], pct: float = pct) -> float | None:
            return percentile(xs, pct) if xs else None

        a_ttft, a_p50, a_p99, a_rate = (pick(column(i)) for i in range(4))
        out = pick([float(o) for o in outs])
        table.add_row(
            label,
            _num_ms(a_ttft),
            _num_ms(a_p50),
            _num_ms(a_p99),
            f"{a_rate:,.1f}" if a_rate is not None else "–",
            f"{out:,.0f}" if out is not None else "–",
        )
        plain.append(
            f"{label} · TTFT {fmt.ms(a_ttft)} · ITL p50 {fmt.ms(a_p50)} · p99 {fmt.ms(a_p99)}"
        )
    reasons = Counter(REASONS.get(ev.reason, ev.reason) for ev in finished)
    failed = sum(1 for c in copies if c.error is not None)
    preempted = sum(1 for ev in finished if ev.preemptions)
    parts = [f"{n:,} {reason}" for reason, n in reasons.most_common()]
    if failed:
        parts.append(f"{failed:,} failed")
    if preempted:
        parts.append(f"{fmt.count(preempted, 'copy', 'copies')} preempted")
    words = f"{len(copies):,} more copies: " + " · ".join(parts)
    table.title = words
    table.title_justify = "left"
    table.title_style = "italic"
    plain.insert(0, words)
    return table, plain
