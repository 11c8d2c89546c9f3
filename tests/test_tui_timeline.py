"""Latency anatomy in the UI (issue 11): the TTFT split in the reply footer, the request
timeline (F6), and the spike cursor that names why a token waited.

All on the FakeEngine: with a 512-token step budget its prefill comes in chunks, so a
second copy of a 1,024-token prompt prefills while the first one decodes, exactly the
situation the timeline is there to show.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import pytest
from textual.widgets import Input
from tui_helpers import NARROW, WIDE, engine_ready, make_app, reply_done, settle

from engine.events import RequestFinished, RequestWork, StepSample, TokenEvent
from engine.fake import FakeConfig
from tui.app import KvscopeApp
from tui.figures import itl_figure
from tui.screens.help import HelpScreen
from tui.telemetry.buffers import Telemetry
from tui.widgets.latency_box import LatencyBox
from tui.widgets.plot import Plot
from tui.widgets.request_timeline import (
    GLYPHS,
    WORST,
    RequestTimeline,
    build_scale,
    lay_out,
)

if TYPE_CHECKING:
    from textual.pilot import Pilot

CHUNKED = FakeConfig(max_model_len=8192, total_blocks=1024, max_num_batched_tokens=512)
"""Prompts prefill in chunks of at most 512 tokens, after the decodes of the step."""


def _app(pilot: Pilot[int]) -> KvscopeApp:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    return app


def _box(pilot: Pilot[int]) -> LatencyBox:
    return _app(pilot).main_screen.engine_panel.query_one(LatencyBox)


async def _send_synthetic(pilot: Pilot[int], tokens: int, copies: int, max_tokens: int) -> None:
    await engine_ready(pilot)
    main = _app(pilot).main_screen
    main.controls.concurrency = copies
    main.controls.slider.value = tokens
    main.controls.synthetic = True
    main.controls.query_one("#max-tokens", Input).value = str(max_tokens)
    await pilot.pause()
    await main.send("", synthetic=True)
    await reply_done(pilot)


async def _prefill_beside_decode(pilot: Pilot[int]) -> None:
    """Two copies of a 1,024-token prompt: r1 prefills in steps 1-2 while r1.2 waits; from
    step 3 r1 decodes while r1.2 prefills its chunks (steps 3-5)."""
    await _send_synthetic(pilot, 1024, copies=2, max_tokens=8)


def _row_kinds(tel: Telemetry, request_id: str) -> list[str]:
    row = tel.timeline.row(request_id)
    assert row is not None, f"no timeline row for {request_id}"
    return [s.kind for s in row.segments]


# -- (a) the TTFT split in the footer ----------------------------------------------------------
async def test_the_footer_splits_the_ttft_into_parts_that_add_up() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=WIDE) as pilot:
        await _send_synthetic(pilot, 2048, copies=1, max_tokens=4)
        reply = app.main_screen.current
        assert reply is not None
        finished = reply.primary.finished
        assert finished is not None
        assert finished.anatomy is not None
        assert finished.ttft_s is not None
        # 2,048 prompt tokens in a 512-token budget: four chunks, and the parts make the TTFT.
        assert finished.anatomy.chunks == 4
        assert finished.anatomy.total_s == pytest.approx(finished.ttft_s, abs=1e-9)
        line = reply.anatomy_text
        match = re.fullmatch(
            r"TTFT (\S+) ms = queue (\S+) \+ prefill (\S+) \(4 chunks\) \+ others (\S+)", line
        )
        assert match, line
        total, *parts = (float(x.replace(",", "")) for x in match.groups())
        # As shown (whole milliseconds above 100 ms), the terms still add up to the total.
        assert sum(parts) == pytest.approx(total, abs=1.5), line
        assert total == pytest.approx(finished.ttft_s * 1000, abs=0.5)


async def test_no_split_without_an_anatomy() -> None:
    """A remote server's finish has no anatomy: the footer says nothing it cannot know."""
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        reply = await main.chat.add_reply("assistant · x", ["x"])
        await reply.add_token(0, TokenEvent("x", 0, (1,), "hi", 1, 1.0, 0.5))
        done = RequestFinished.from_times(
            "x", "stop", prompt_tokens=3, submitted_at=0.5, token_times=[1.0], now=1.0
        )
        await reply.finish(0, done)
        await settle(pilot)
        assert reply.anatomy_text == ""
        assert reply.footer_text.startswith("TTFT 500 ms")


# -- (b) the timeline ----------------------------------------------------------------------
async def test_the_timeline_shows_one_request_prefilling_while_the_other_decodes() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=WIDE) as pilot:
        await _prefill_beside_decode(pilot)
        tel = app.telemetry
        assert _row_kinds(tel, "r1") == ["prefill", "decode"]
        assert _row_kinds(tel, "r1.2") == ["queued", "prefill", "decode"]
        r1 = tel.timeline.row("r1")
        r2 = tel.timeline.row("r1.2")
        assert r1 is not None
        assert r2 is not None
        # r1.2 waited exactly while r1 prefilled, and prefilled while r1 decoded.
        r1_prefill, r1_decode = r1.segments
        r2_queued, r2_prefill, _ = r2.segments
        assert r2_queued.end == pytest.approx(r1_prefill.end)
        assert r1_decode.start <= r2_prefill.start
        assert r2_prefill.end <= r1_decode.end
        # Drawn: each row in its glyphs, the decode of r1 above the prefill of r1.2.
        await pilot.press("f6")
        await settle(pilot)
        timeline = _box(pilot).timeline
        layout = lay_out(tel, timeline.size.width, timeline.size.height)
        assert layout.rows == ("r1", "r1.2")
        ruler, row1, row2 = (layout.plain().splitlines() + [""] * 3)[:3]
        label = len("r1.2 ")
        bar1, bar2 = row1[label:], row2[label:]
        prefill, decode, queued = GLYPHS["prefill"], GLYPHS["decode"], GLYPHS["queued"]
        assert re.fullmatch(f"{prefill}+{decode}+ *", bar1), bar1
        assert re.fullmatch(f"{queued}+{prefill}+{decode}+ *", bar2), bar2
        overlap = [c for c, g in enumerate(bar2) if g == prefill and bar1[c] == decode]
        assert overlap, "no column shows r1 decoding while r1.2 prefills"
        # One tick per step (7 steps of tens of ms over ~50 columns: none shares a column).
        assert ruler[label:].count("┬") + ruler[label:].count(WORST) >= len(tel.timeline.steps) - 1
        assert layout.title.startswith("Timeline · 2 requests · steps 1–")


async def test_the_worst_itl_is_marked_on_the_ruler_above_the_step_that_made_it() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=WIDE) as pilot:
        await _prefill_beside_decode(pilot)
        tel = app.telemetry
        worst = tel.worst_token()
        assert worst is not None
        layout = lay_out(tel, 60, 6)
        assert layout.scale is not None
        record = tel.timeline.step(tel.tokens[worst].step)
        assert record is not None
        column = layout.scale.column((record.start + record.end) / 2)
        label = len("r1.2 ")
        assert layout.plain().splitlines()[0][label + column] == WORST


def test_idle_stretches_between_requests_are_cut_to_one_column() -> None:
    scale = build_scale([(0.0, 1.0), (30.0, 31.0)], 41)
    assert scale is not None
    assert scale.cuts == (20,)  # 40 columns of busy time, 20 each side of the cut
    assert scale.column(0.0) == 0
    assert scale.column(31.0) == 40
    assert scale.column(15.0) == 20
    assert scale.seconds_per_col == pytest.approx(2.0 / 40)


def test_the_timeline_keeps_bounded_history() -> None:
    tel = Telemetry(steps=16)
    for step in range(1, 200):
        tel.add_sample(_decode_sample(step, ("a",)))
    assert len(tel.timeline.steps) == 16
    row = tel.timeline.row("a")
    assert row is not None
    assert [s.kind for s in row.segments] == ["decode"]


def test_a_short_preemption_and_its_recompute_stay_visible_in_a_squeezed_row() -> None:
    """100 steps in 20 columns: the one preempted step and the one recompute step still
    show, over the decode steps that share their columns."""
    tel = Telemetry()
    tel.track_request("r1")
    for step in range(1, 101):
        if step == 50:  # preempted: it waits a step, its KV gone
            sample = _decode_sample(step, ())
            sample = dataclasses.replace(sample, preempted_ids=("r1",), waiting_ids=("r1",))
        elif step == 51:  # recompute: its prompt and output again, as prefill
            sample = _decode_sample(step, (), prefill=(("r1", 300),))
        else:
            sample = _decode_sample(step, ("r1",))
        tel.add_sample(sample)
    assert _row_kinds(tel, "r1") == ["decode", "preempted", "prefill", "decode"]
    bar = lay_out(tel, 23, 2).plain().splitlines()[1][3:]
    assert len(bar) == 20
    preempted, prefill = GLYPHS["preempted"], GLYPHS["prefill"]
    assert re.fullmatch(f"{GLYPHS['decode']}+{preempted}+{prefill}?{GLYPHS['decode']}+", bar), bar
    assert preempted in bar


# -- (c) naming a spike --------------------------------------------------------------------------
async def test_the_spike_line_names_the_other_requests_prefill_chunk() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=WIDE) as pilot:
        await _prefill_beside_decode(pilot)
        await pilot.press("f6")  # the timeline, and the keys
        box = _box(pilot)
        assert box.has_focus
        await settle(pilot)
        # Focused, the cursor starts on the worst token: one that waited for r1.2's chunk.
        tel = app.telemetry
        worst = tel.worst_token()
        assert tel.cursor == worst
        assert worst is not None
        step = tel.tokens[worst].step
        assert re.fullmatch(
            rf"r1: token {worst + 1} of {len(tel.tokens)} waited \S+ ms: step {step} also ran "
            r"a 511-token prefill chunk "
            r"of r1\.2",
            box.spike_text,
        ), box.spike_text
        # The last token waited for nothing but its own step.
        await pilot.press("right_square_bracket", "right_square_bracket", "right", "right")
        await pilot.press("right", "right", "right", "right")
        last = len(tel.tokens) - 1
        assert tel.cursor == last
        assert re.fullmatch(
            rf"r1: token {last + 1} of {last + 1} waited \S+ ms: step \d+ decoded 2 requests, "
            r"and that was the whole wait",
            box.spike_text,
        ), box.spike_text
        await pilot.press("left_square_bracket")
        assert tel.cursor == last - 1
        await pilot.press("w")
        assert tel.cursor == worst
        # In the ITL view the cursor is a vertical line on the plot at the token's x.
        await pilot.press("f6")
        await settle(pilot)
        figure, _ = itl_figure(tel, 50, 10)
        assert figure is not None
        assert [r.at for r in figure.rules if r.vertical] == [float(worst)]


def _decode_sample(
    step: int,
    decoders: tuple[str, ...],
    *,
    prefill: tuple[tuple[str, int], ...] = (),
    started: float | None = None,
    duration: float = 0.02,
    work: bool = True,
) -> StepSample:
    items = [RequestWork(r, 0, 1) for r in decoders] + [RequestWork(r, n, 0) for r, n in prefill]
    return StepSample(
        step=step,
        started_at=started if started is not None else step * 0.02,
        duration_s=duration,
        prefill_tokens=sum(n for _, n in prefill),
        decode_tokens=len(decoders),
        running=len(items),
        waiting=0,
        kv_usage=0.1,
        free_blocks=90,
        total_blocks=100,
        block_size=16,
        work=tuple(items) if work else (),
    )


def _token(step: int, index: int, time_s: float, latency_s: float) -> TokenEvent:
    return TokenEvent("r1", index, (1000 + index,), "x", step, time_s, latency_s)


def test_the_issues_own_example_sentence() -> None:
    """ "token 37 waited 412 ms: step 118 also ran a 2,048-token prefill chunk of r4"."""
    tel = Telemetry()
    tel.track_request("r1")
    t = 0.0
    for step in range(81, 118):  # r1 decodes alone: one token a step
        tel.add_sample(_decode_sample(step, ("r1",), started=t))
        t += 0.02
        tel.add_token(_token(step, step - 81, t, 0.02))
    tel.add_sample(_decode_sample(118, ("r1",), prefill=(("r4", 2048),), started=t, duration=0.412))
    tel.add_token(_token(118, 37, t + 0.412, 0.412))
    assert tel.worst_token() == 37
    assert tel.explain_token(37) == (
        "token 38 of 38 waited 412 ms: step 118 also ran a 2,048-token prefill chunk of r4"
    )
    assert tel.explain_token(36) == (
        "token 37 of 38 waited 20.0 ms: step 117 decoded 1 request, and that was the whole wait"
    )
    # "an 8,192-token", not "a 8,192-token".
    tel.add_sample(
        _decode_sample(119, ("r1",), prefill=(("r5", 8192),), started=t + 0.412, duration=0.9)
    )
    tel.add_token(_token(119, 38, t + 1.312, 0.9))
    assert tel.explain_token(38).endswith("step 119 also ran an 8,192-token prefill chunk of r5")


def test_a_remote_engine_cannot_name_the_cause() -> None:
    """A remote server's samples are /metrics scrapes: tokens, but no per-request work."""
    tel = Telemetry()
    tel.track_request("r1")
    tel.add_sample(_decode_sample(1, ("r1",), work=False))
    tel.add_token(_token(1, 0, 0.04, 0.04))
    tel.add_token(_token(2, 1, 0.5, 0.46))
    assert tel.explain_token(1) == (
        "token 2 of 2 waited 460 ms: this engine does not show its steps (a remote server), "
        "so the cause cannot be known remotely"
    )
    assert "remote server" in lay_out(tel, 60, 8).plain()


# -- F6, the palette, the help, the narrow layout --------------------------------------------------
async def test_f6_toggles_the_itl_plot_and_the_timeline() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=WIDE) as pilot:
        await _prefill_beside_decode(pilot)
        box = _box(pilot)
        plot = box.query_one(Plot)
        timeline = box.query_one(RequestTimeline)
        assert plot.display
        assert not timeline.display
        assert str(box.border_title).startswith("ITL per output token · r1")
        await pilot.press("f6")
        await settle(pilot)
        assert box.mode == "timeline"
        assert timeline.display
        assert not plot.display
        assert str(box.border_title).startswith("Timeline · 2 requests")
        assert all(
            w in str(box.border_subtitle) for w in ("queued", "prefill", "decode", "preempted")
        )
        await pilot.press("f6")
        await settle(pilot)
        assert box.mode == "itl"
        assert plot.display
        assert not timeline.display
        assert str(box.border_title).startswith("ITL per output token · r1")
        # The command palette offers it, and the help lists the key and the cursor keys.
        commands = [c.title for c in app.get_system_commands(app.main_screen)]
        assert "Request timeline (F6)" in commands
        await pilot.press("f1")
        await settle(pilot)
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        rows = dict(r for _, section in help_screen.key_sections() for r in section)
        assert rows["f6"] == "ITL plot / request timeline"
        assert rows["[ / left"] == "Previous token"


async def test_the_timeline_in_the_narrow_layout() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=NARROW) as pilot:
        await _prefill_beside_decode(pilot)
        main = app.main_screen
        assert main.has_class("-narrow")
        await pilot.press("f6")  # from the Chat tab: the Engine tab opens at the timeline
        await settle(pilot)
        assert main.engine_panel.has_class("-active")
        box = _box(pilot)
        timeline = box.timeline
        assert timeline.size.width >= 60
        assert timeline.size.height >= 3
        grid = main.engine_panel.query_one("#engine-grid")
        assert grid.region.contains_region(box.region), "the timeline is not on screen"
        text = timeline.as_text().plain.splitlines()
        assert text[1].startswith("r1 ")
        assert text[2].startswith("r1.2 ")
        assert box.spike_text.startswith("r1: token ")


# -- snapshots -------------------------------------------------------------------------------------
async def _timeline_on_the_worst_token(pilot: Pilot[int]) -> None:
    await _prefill_beside_decode(pilot)
    await pilot.press("f6")
    await pilot.press("w")
    await settle(pilot)


@pytest.mark.parametrize(
    "size", [pytest.param(WIDE, id="160x48"), pytest.param(NARROW, id="80x24")]
)
def test_timeline_snapshot(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(
        make_app(CHUNKED), terminal_size=size, run_before=_timeline_on_the_worst_token
    )


async def test_up_and_down_scroll_the_rows_in_the_timeline_only() -> None:
    app = make_app(CHUNKED)
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        tel = app.telemetry
        # Thirty requests one after the other: more rows than the narrow box has lines.
        for k in range(30):
            tel.add_sample(_decode_sample(k + 1, (f"q{k}",), started=k * 0.02))
        tel.add_sample(dataclasses.replace(_decode_sample(31, ()), idle=True))
        await pilot.press("f6")
        await settle(pilot)
        box = _box(pilot)
        timeline = box.timeline
        shown = timeline.layout_now().rows
        assert shown[-1] == "q29"
        assert len(shown) == timeline.size.height - 1
        assert f"requests {31 - len(shown):,}–30 of 30 (↑↓)" in str(box.border_title)
        await pilot.press("up", "up")
        await settle(pilot)
        assert timeline.layout_now().rows[-1] == "q27"
        await pilot.press("down")
        await settle(pilot)
        assert timeline.layout_now().rows[-1] == "q28"
        # In the ITL view the keys are the panel's own again: up/down scroll the Engine tab.
        await pilot.press("f6")
        await settle(pilot)
        grid = app.main_screen.engine_panel.query_one("#engine-grid")
        before = grid.scroll_y
        await pilot.press("up")
        await settle(pilot)
        assert timeline.scroll_back == 1
        assert grid.scroll_y != before
