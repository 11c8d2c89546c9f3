"""Issue 31, items 9, 10 and 12: the prefill estimate, host-busy points, the timeline's words.

9. One short prompt's prefill is mostly fixed cost: read as a rate, it made "512 prompt
   tokens ≈ 12 s" of a send that took 2.4 s. The estimate fits a fixed cost plus a
   per-token rate, is rough until two lengths are measured, and is never shown beside
   "the engine will refuse this prompt".
10. Points measured while the host was busy are drawn apart on "Latency vs prompt tokens",
   and the key says why.
12. The `w` line names its request, the timeline scrolls to that request's row, and long
   IDs are cut to their distinct end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from textual.widgets import Static
from tui_helpers import (
    WIDE,
    engine_ready,
    make_app,
    reply_done,
    send_chat,
    settle,
    step_sample,
    wait_until,
)

from engine.events import RequestAccepted
from engine.fake import FakeConfig
from tui import figures
from tui import format as fmt
from tui.telemetry.buffers import Telemetry
from tui.telemetry.host_watch import HostWatch
from tui.widgets.latency_box import LatencyBox
from tui.widgets.request_timeline import lay_out

if TYPE_CHECKING:
    from tui.app import KvscopeApp


# -- 9. the prefill estimate -------------------------------------------------------------------
def _estimate_words(app: KvscopeApp) -> str:
    return str(app.main_screen.controls.query_one("#send-estimate", Static).render())


async def _synthetic(app: KvscopeApp, tokens: int) -> None:
    controls = app.main_screen.controls
    controls.slider.value = tokens
    controls.synthetic = True


async def test_one_short_prefill_is_not_read_as_a_rate() -> None:
    # The live case: one ~100-token chat prefilled in 2.4 s, nearly all of it fixed cost.
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        app.telemetry.add_sample(step_sample(prefill=100, duration=2.4))
        await _synthetic(app, 512)
        await pilot.pause()
        guess = main.send_estimate()
        as_rate = fmt.duration(512 * 2.4 / 100)  # "12 s": what it used to say
        if guess is not None:
            words = guess.words()
            # Never "≈" the rate's figure: one length cannot tell fixed cost from rate.
            assert f"≈ {as_rate}" not in words, words
            assert "rough" in words, words
            # Between all fixed cost (2.4 s) and all rate (12 s), and it says both.
            assert fmt.duration(2.4) in words and as_rate in words, words


async def test_two_lengths_give_a_fixed_cost_and_a_rate() -> None:
    # seconds = 2.3 + 0.0005 x tokens, measured at 100 and 1,000 tokens.
    fixed, per_token = 2.3, 0.0005
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        for step, n in enumerate((100, 1000, 100, 1000), start=1):
            sample = step_sample(step, prefill=n, duration=fixed + per_token * n)
            app.telemetry.add_sample(sample)
        await _synthetic(app, 1024)
        main.controls.concurrency = 4  # 4,096 tokens: 4.35 s, not 19 s at the mean rate
        await pilot.pause()
        guess = main.send_estimate()
        assert guess is not None
        expected = fixed + per_token * 4096
        assert guess.seconds == pytest.approx(expected, rel=1e-6)
        words = guess.words()
        assert f"4,096 prompt tokens ≈ {fmt.duration(expected)}" in words, words
        assert "a fixed 2.3 s" in words, words
        assert f"{1 / per_token:,.0f} tokens/s" in words, words


async def test_no_estimate_beside_the_engines_refusal() -> None:
    # A measured fit that makes 2,048 tokens a long send (2 + 0.01 x 2,048 = 22 s).
    app = make_app()  # max_model_len 2,048: a prompt of 2,048 is refused
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        for step, n in enumerate((100, 1000), start=1):
            app.telemetry.add_sample(step_sample(step, prefill=n, duration=2.0 + 0.01 * n))
        await _synthetic(app, 2047)
        await pilot.pause()
        main._update_estimate()
        await pilot.pause()
        assert "2,047 prompt tokens ≈" in _estimate_words(app)  # fits: estimated
        await _synthetic(app, 2048)
        await pilot.pause()
        main._update_estimate()
        await pilot.pause()
        assert "engine will refuse this prompt" in str(main.controls.slider.render())
        assert main.send_estimate() is None
        assert not main.controls.query_one("#send-estimate", Static).display


def test_the_fit_is_least_squares_and_never_a_negative_fixed_cost() -> None:
    from tui.telemetry.prefill_fit import fit_prefill

    # Three exact points of 0.5 s + 1 ms a token, and noise-free: recovered exactly.
    fit = fit_prefill([(n, 0.5 + 0.001 * n) for n in (64, 256, 1024)])
    assert fit is not None
    assert fit.fixed_s == pytest.approx(0.5)
    assert fit.per_token_s == pytest.approx(0.001)
    # Least squares over noisy points: the line that minimises the squared error.
    pairs = [(100, 1.0), (200, 1.3), (300, 1.5)]
    fit = fit_prefill(pairs)
    assert fit is not None
    assert fit.per_token_s == pytest.approx(0.0025)
    assert fit.fixed_s == pytest.approx(1.2667 - 0.0025 * 200, abs=1e-4)
    # A line through negative time at 0 tokens: the fixed cost is 0, the rate refitted.
    fit = fit_prefill([(100, 0.05), (1000, 1.0)])
    assert fit is not None
    assert fit.fixed_s == 0.0
    assert fit.per_token_s == pytest.approx((100 * 0.05 + 1000 * 1.0) / (100**2 + 1000**2))
    # One length, or longer prompts no slower: no rate can be told.
    assert fit_prefill([(100, 2.4), (100, 2.5)]) is None
    assert fit_prefill([(100, 2.4), (1000, 2.3)]) is None


def test_distinct_lengths_outlive_many_steps_of_one_length() -> None:
    # Under load every step prefills the same 512 tokens: the earlier 100-token chat must
    # not be pushed out of what the fit reads, or the estimate turns rough again.
    tel = Telemetry()
    tel.add_sample(step_sample(1, prefill=100, duration=0.2))
    for step in range(2, 200):
        tel.add_sample(step_sample(step, prefill=512, duration=0.6))
    lengths = {n for n, _ in tel.prefill_steps()}
    assert lengths == {100, 512}


# -- 10. host-busy points ----------------------------------------------------------------------
async def test_points_measured_on_a_busy_host_are_drawn_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tui.widgets import engine_panel

    monkeypatch.setattr(engine_panel, "HOST_CHECK_S", 0.0)
    load = {"now": 0.5}
    app = make_app()
    app.telemetry.host = HostWatch(load_average=lambda: load["now"], cores=2)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        app.telemetry.host.check_load = True
        await send_chat(pilot, "hello")
        await reply_done(pilot)
        load["now"] = 3.0  # load 3 on 2 cores, as in the live run
        await send_chat(pilot, "hello again, a little longer this time")
        await reply_done(pilot)
        await settle(pilot)
        calm, busy = list(app.telemetry.points)
        assert calm.host_busy is None
        assert busy.host_busy is not None and "load 3.0 on 2 cores" in busy.host_busy
        figure, summary = figures.latency_figure(app.telemetry, 60, 12)
        assert figure is not None
        assert summary.host_busy == 1
        strips = (figure, figure.below) if figure.below else (figure,)
        by_mark = {s.marker: s for f in strips for s in f.series}
        # The calm point in the usual glyphs, the busy one only in the busy ones.
        assert by_mark[figures.TTFT_MARK].xs == (float(calm.prompt_tokens),)
        assert by_mark[figures.ITL_MARK].xs == (float(calm.prompt_tokens),)
        assert by_mark[figures.BUSY_TTFT_MARK].xs == (float(busy.prompt_tokens),)
        assert by_mark[figures.BUSY_ITL_MARK].xs == (float(busy.prompt_tokens),)
        assert by_mark[figures.BUSY_TTFT_MARK].role == "axes"  # dim: the muted colour
        box = app.main_screen.engine_panel.query_one("#ttft-box")
        assert "host busy" in str(box.border_subtitle)
        assert figures.BUSY_TTFT_MARK in str(box.border_subtitle)
        assert "1 host busy" in str(box.border_title)


def test_a_calm_host_adds_nothing_to_the_key() -> None:
    tel = Telemetry(host=HostWatch(load_average=lambda: 0.1, cores=2))
    tel.host.check_load = True
    assert tel.host.busy_words() is None
    tel.host.check_load = False  # a GPU engine: the host's load is not the engine's
    tel.host.load_average = lambda: 9.0
    assert tel.host.busy_words() is None


# -- 12. the timeline and the `w` line ---------------------------------------------------------
def test_long_ids_are_cut_to_their_distinct_end() -> None:
    tel = Telemetry()
    tel.timeline.per_request = True  # as the fake and vLLM in-process say
    ids = [f"load-1204576725-1-{k}" for k in (8, 9, 10, 61)]
    for k, rid in enumerate(ids):
        tel.add_accepted(RequestAccepted(rid, 32, float(k)))
    tel.add_sample(step_sample(1, started_at=5.0, prefill=4, duration=0.5))
    layout = lay_out(tel, 50, 6)
    labels = [line[0][0].strip() for line in layout.lines[1:]]
    assert labels == ["…-1-8", "…-1-9", "…-1-10", "…-1-61"], labels
    # Short IDs are shown whole.
    tel = Telemetry()
    tel.timeline.per_request = True
    for k, rid in enumerate(("r1", "r1.2")):
        tel.add_accepted(RequestAccepted(rid, 32, float(k)))
    labels = [line[0][0].strip() for line in lay_out(tel, 50, 4).lines[1:]]
    assert labels == ["r1", "r1.2"]


async def test_w_names_its_request_and_the_timeline_scrolls_to_it() -> None:
    app = make_app(FakeConfig(reply_words=tuple(f"w{i}" for i in range(40))))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 24  # r1 and 23 copies: r1's row is far above the newest
        await send_chat(pilot, "hi")
        await reply_done(pilot)
        await settle(pilot)
        box = main.engine_panel.query_one(LatencyBox)
        rows = len(app.telemetry.timeline.rows)
        await pilot.press("f6")  # the timeline, focused: the line explains r1's worst token
        await settle(pilot)
        await wait_until(pilot, lambda: bool(box.spike_text))
        assert box.mode == "timeline"
        assert app.telemetry.itl_request == "r1"
        layout = box.timeline.layout_now()
        assert len(layout.rows) < rows  # not every row fits: r1's had to be scrolled to
        assert box.spike_text.startswith("r1: token "), box.spike_text
        assert "r1" in layout.rows, layout.rows
        # Scrolling on from there is the user's: the rows follow the keys, and r1 goes.
        for _ in range(rows):
            await pilot.press("down")
        await settle(pilot)
        assert "r1" not in box.timeline.layout_now().rows
        # w brings the explained request back into view.
        await pilot.press("w")
        await settle(pilot)
        assert box.spike_text.startswith("r1: token "), box.spike_text
        assert "r1" in box.timeline.layout_now().rows
