"""Tapes carry each step's FLOP and byte counts (StepSample.perf), so a replay draws the
roofline (issue #32); a tape written before the counts still loads and plays, and says
why it has no points.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
from test_tape import Session, record_fake_session
from test_tui_replay import POOL, playing, replay_app, shown
from tui_helpers import WIDE, settle, step_sample

from engine.events import StepPerf
from engine.tape import read_tape
from engine.tape.format import Decoder, Encoder
from engine.tape.values import MAX_NUMBER
from tui.roofline_figure import NO_PERF_WORDS
from tui.widgets.plot import Plot

if TYPE_CHECKING:
    from pathlib import Path


def test_a_big_models_prefill_counts_read_back() -> None:
    # Llama 3 70B's 8,192-token prefill: 2 FLOPs per parameter per token, over 10^15,
    # past the bound the tape puts on other numbers (a card's, a server's timings).
    params = 70_553_706_496
    tokens = 8192
    flops = 2.0 * params * tokens
    assert flops > MAX_NUMBER
    perf = StepPerf(flops, 2.0 * params, 1e9, "vllm")  # bf16 weights, read once
    sample = dataclasses.replace(step_sample(step=1, prefill=tokens, duration=2.0), perf=perf)
    record = Encoder().encode("step", sample, 0.0)
    back, _ = Decoder().decode(record)
    assert back == sample


@pytest.fixture
def session(tmp_path: Path) -> Session:
    return record_fake_session(tmp_path / "session.jsonl")


async def test_a_replay_draws_the_taped_steps_on_the_roofline(session: Session) -> None:
    counted = [s for s in session.steps if s.perf is not None and not s.idle]
    assert counted, "the fake counts every step's work"
    tape = read_tape(session.path)
    assert [s.perf for s in tape.steps] == [s.perf for s in session.steps]
    app = replay_app(tape)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        await pilot.press("end")
        await shown(pilot)
        await pilot.press("f8")
        await settle(pilot)
        points = list(app.telemetry.perf_points)
        assert [p.step for p in points] == [s.step for s in counted]
        panel = main.engine_panel
        plot = panel.query_one("#roofline-plot", Plot)
        assert plot.has_drawing
        title = str(panel.query_one("#roofline-box").border_title)
        assert f"{len(counted):,} steps (fake)" in title


async def test_a_tape_from_before_the_counts_plays_and_says_why_no_point() -> None:
    tape = read_tape(POOL)
    assert tape.steps and all(s.perf is None for s in tape.steps)
    app = replay_app(tape)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        await pilot.press("end")
        await shown(pilot)
        await pilot.press("f8")
        await settle(pilot)
        assert not app.telemetry.perf_points
        plot = main.engine_panel.query_one("#roofline-plot", Plot)
        assert not plot.has_figure
        assert str(plot.render()) == NO_PERF_WORDS
