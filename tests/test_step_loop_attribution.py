"""benchmarks/overhead.py's attribution of a round's time on the step thread: every part is
the duration of some code, none is negative, and the parts add up to the round."""

from __future__ import annotations

import pytest

from benchmarks.overhead import PARTS, Span, Timeline, attribute


def _sum(parts: dict[str, float]) -> float:
    return sum(parts.values())


def test_nested_spans_leave_their_time_out_of_their_parent() -> None:
    timeline = Timeline()
    clock = iter(range(100))

    inner = timeline.timed("step", lambda: next(clock))
    outer = timeline.timed("one_step", lambda: (next(clock), inner(), next(clock)))
    outer()
    step, one_step = timeline.spans
    assert (step.kind, step.depth, one_step.kind, one_step.depth) == ("step", 1, "one_step", 0)
    # The parent's own time and its child's make up its wall time, exactly.
    wall = one_step.ended - one_step.began
    assert one_step.own_s + step.own_s == pytest.approx(wall)
    assert 0.0 <= one_step.own_s <= wall
    assert one_step.own_cpu_s >= 0.0


def _step(began: float, step_s: float, book_s: float, *, tokens_s: float = 0.0) -> list[Span]:
    """One kvscope `_one_step` from `began`: vLLM's step, then bookkeeping and hand-out."""
    end = began + step_s + book_s + tokens_s
    return [
        Span("step", began, began + step_s, step_s, step_s, 1),
        Span("hand_out", end - tokens_s, end, tokens_s, tokens_s, 1),
        Span("one_step", began, end, book_s, book_s, 0),
    ]


def test_parts_add_up_to_the_round_and_none_is_negative() -> None:
    spans = [
        Span("wait", -5.0, 1.0, 6.0, 0.0, 0),  # idle from before the round to the first add
        *_step(1.0, 40.0, 0.5, tokens_s=0.25),
        Span("drain", 41.75, 41.8, 0.05, 0.05, 0),
        *_step(42.0, 40.0, 0.5, tokens_s=0.25),
        Span("wait", 82.75, 200.0, 117.25, 0.0, 0),  # after the last step, past the round
    ]
    got = attribute(spans, 0.0, 83.0)
    assert set(got.parts) == {k for k, _ in PARTS}
    assert all(v >= 0.0 for v in got.parts.values())
    assert got.wall_s == pytest.approx(83.0)
    assert _sum(got.parts) == pytest.approx(83.0)
    assert got.parts["step"] == pytest.approx(80.0)
    assert got.parts["book"] == pytest.approx(1.0)
    assert got.parts["tokens"] == pytest.approx(0.5)
    assert got.parts["first"] == pytest.approx(1.0)  # clipped at the round's start
    assert got.parts["last"] == pytest.approx(0.25)  # clipped at the round's end
    assert got.parts["loop"] == pytest.approx(0.2 + 0.05)  # in no span, and the drain
    assert got.steps == 2


def test_a_round_the_consumer_ends_inside_the_last_step_counts_that_step_whole() -> None:
    # The consumer reads the last step's events from its hand-off, inside `_one_step`, and can
    # end the round before that returns. Counting the step's vLLM time but not the rest of
    # its bookkeeping made the bookkeeping read negative once (issue 30).
    spans = _step(0.0, 40.0, 2.0)
    got = attribute(spans, 0.0, 40.5)
    assert all(v >= 0.0 for v in got.parts.values())
    assert got.parts["book"] == pytest.approx(2.0)
    assert got.wall_s == pytest.approx(42.0)
    assert _sum(got.parts) == pytest.approx(got.wall_s)


def test_idle_between_requests_is_named_apart_from_the_start_and_the_end() -> None:
    spans = [
        *_step(0.0, 10.0, 0.0),
        Span("add", 12.0, 12.5, 0.5, 0.5, 1),
        Span("wait", 10.0, 12.5, 2.0, 0.0, 0),  # the consumer's round trip, then an add
        *_step(12.5, 10.0, 0.0),
    ]
    got = attribute(spans, 0.0, 22.5)
    assert got.parts["between"] == pytest.approx(2.0)
    assert got.parts["add"] == pytest.approx(0.5)
    assert got.parts["first"] == got.parts["last"] == 0.0
    assert _sum(got.parts) == pytest.approx(22.5)


def test_the_bare_loop_inside_a_command_call_is_split_as_well() -> None:
    # The bare loop runs inside the step thread's wait for a command, still open when its
    # round is read: its spans are nested one deep, and the loop is only what they leave.
    spans = [
        Span("bare_add", 0.0, 1.0, 1.0, 1.0, 1),
        Span("step", 1.0, 41.0, 40.0, 40.0, 1),
        Span("step", 41.5, 81.5, 40.0, 40.0, 1),
    ]
    got = attribute(spans, 0.0, 82.0)
    assert got.parts["loop"] == pytest.approx(1.0)
    assert _sum(got.parts) == pytest.approx(82.0)
