"""The token explainer: why one token of the tracked reply took as long as it did, in words.

It reads the tracked reply's tokens (each with the step that made it) against the steps
the timeline kept: a preemption, steps that ran without it, other requests' prefill
chunks, or a plain decode step. The first token's wait is its TTFT, told as the terms of
its anatomy (`anatomy_words`), which the reply's footer shows too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from tui import format as fmt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.events import RequestFinished, TtftAnatomy
    from tui.telemetry.host_watch import HostWatch
    from tui.telemetry.timeline import StepRecord, Timeline


class TokenMark(NamedTuple):
    """One token of the tracked reply: the step that made it, when, and how long it took."""

    step: int
    time_s: float
    latency_s: float


def explain_token(
    tokens: Sequence[TokenMark],
    index: int,
    *,
    timeline: Timeline,
    request_id: str | None,
    finish: RequestFinished | None,
    host: HostWatch | None = None,
) -> str:
    """Why token `index` of the tracked reply (`request_id`, its `tokens` and, once over,
    its `finish`) took as long as it did, in one line; `host` names a busy host.

    Tokens are numbered from 1, as the reply's footer counts them ("output 256 tokens"):
    index 0 is "token 1 of 256"."""
    if not 0 <= index < len(tokens):
        return "no token there yet"
    mark = tokens[index]
    if index == 0:
        return _explain_first(mark, finish, len(tokens))
    head = f"{token_name(index, len(tokens))} waited {fmt.ms(mark.latency_s)}"
    if not timeline.per_request:
        return (
            f"{head}: this engine does not show its steps (a remote server), "
            "so the cause cannot be known remotely"
        )
    record = timeline.step(mark.step)
    if record is None:
        kept = len(timeline.steps)
        return f"{head}: step {mark.step:,} is older than the last {kept:,} steps kept"
    me = request_id
    # Steps after the token's own could not have held it up.
    waited = [
        r
        for r in timeline.steps_in(mark.time_s - mark.latency_s, mark.time_s)
        if r.step <= mark.step
    ]
    if record not in waited:
        waited.append(record)
    preempted_at = [r.step for r in waited if me in r.preempted]
    if preempted_at:
        return (
            f"{head}: it was preempted at step {preempted_at[0]:,} and recomputed "
            f"over {fmt.count(len(waited), 'step')} ({waited[0].step:,}–{waited[-1].step:,})"
        )
    prefills = _prefills(waited, me)
    ran_me = [r for r in waited if any(rid == me for rid, _, _ in r.work)]
    if len(waited) > 1 and len(ran_me) < len(waited):
        # Steps went by without it: it waited for its turn, not only for one step.
        skipped = len(waited) - len(ran_me)
        what = f"{fmt.count(skipped, 'step')} ran without it"
        if prefills:
            what += f"; they ran {_prefill_words(prefills)}"
        return f"{head}: {what} (steps {waited[0].step:,}–{waited[-1].step:,})"
    if prefills:
        where = (
            f"step {record.step:,}"
            if len(waited) == 1
            else f"steps {waited[0].step:,}–{waited[-1].step:,}"
        )
        return f"{head}: {where} also ran {_prefill_words(prefills)}"
    decoders = sum(1 for _, _, d in record.work if d > 0)
    took = record.duration_s
    did = f"step {record.step:,} decoded {fmt.count(decoders, 'request')}"
    busy = host.stall_words(decoders, took) if host is not None else None
    # The step's own time is said only when it is not the wait already said.
    whole = took >= 0.9 * mark.latency_s
    if busy is not None:
        took_words = "took it all" if whole else f"took {fmt.ms(took)} of it"
        return f"{head}: {busy}; {did} and {took_words}"
    if whole:
        return f"{head}: {did}, and that was the whole wait"
    words = f"{head}: {did} in {fmt.ms(took)}"
    if took < 0.5 * mark.latency_s:
        words += "; the rest passed between steps, outside the engine"
    return words


def token_name(index: int, count: int) -> str:
    """ "token 213 of 256" for output index 212: counted from 1, as the footer counts."""
    return f"token {index + 1:,} of {count:,}"


def _explain_first(mark: TokenMark, finish: RequestFinished | None, count: int) -> str:
    head = f"{token_name(0, count)} is the first"
    if finish is not None and finish.anatomy is not None:
        return f"{head}: {anatomy_words(finish.anatomy, finish.ttft_s)}"
    return f"{head}: TTFT {fmt.ms(mark.latency_s)}"


def _prefills(records: list[StepRecord], me: str | None) -> list[tuple[str, int]]:
    """Other requests' prefill tokens over `records`, biggest first."""
    totals: dict[str, int] = {}
    for r in records:
        for rid, p, _ in r.work:
            if rid != me and p > 0:
                totals[rid] = totals.get(rid, 0) + p
    return sorted(totals.items(), key=lambda kv: -kv[1])


def _article(n: int) -> str:
    """ "a" or "an" before a number read aloud: an 8,192-token, an 11-token, a 2,048-token."""
    lead = f"{n:,}".split(",")[0]
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


def _prefill_words(prefills: list[tuple[str, int]]) -> str:
    if len(prefills) == 1:
        rid, n = prefills[0]
        return f"{_article(n)} {n:,}-token prefill chunk of {rid}"
    shown = [f"{rid} ({n:,} tokens)" for rid, n in prefills[:3]]
    more = len(prefills) - len(shown)
    tail = f" and {more:,} more" if more else ""
    listed = ", ".join(shown[:-1]) + " and " + shown[-1] if not more else ", ".join(shown)
    return f"prefill chunks of {listed}{tail}"


def anatomy_parts(anatomy: TtftAnatomy, ttft_s: float | None = None) -> tuple[str, ...]:
    """("TTFT 2,310 ms = queue 50", "prefill 1,900 (4 chunks)", "others 360"): the terms
    of the sum, each in the total's unit and precision, so that they read as one sum."""
    total = ttft_s if ttft_s is not None else anatomy.total_s
    # Milliseconds at fmt.ms's precision, as the footer above prints "TTFT 2,630 ms":
    # one unit in one footer, never "2,630 ms" over "2.63 s".
    unit, scale = "ms", 1000.0
    places = 0 if total >= 0.1 else 1 if total >= 0.01 else 2

    def num(value: float) -> str:
        value = max(0.0, value) * scale  # a share computed as a difference can be -1e-18
        return f"{value:,.{places}f}"

    parts = [
        f"TTFT {num(total)} {unit} = queue {num(anatomy.queue_s)}",
        f"prefill {num(anatomy.prefill_s)} ({fmt.count(anatomy.chunks, 'chunk')})",
        f"others {num(anatomy.others_s)}",
    ]
    if anatomy.preempted_s > 0:
        parts.append(f"preempted {num(anatomy.preempted_s)}")
    return tuple(parts)


def anatomy_words(anatomy: TtftAnatomy, ttft_s: float | None = None) -> str:
    """ "TTFT 2,310 ms = queue 50 + prefill 1,900 (4 chunks) + others 360"."""
    return " + ".join(anatomy_parts(anatomy, ttft_s))
