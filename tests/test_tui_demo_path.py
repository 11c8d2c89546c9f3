"""The demo path (issue 9) and the TUI's share of the bad-input matrix (issue 8).

Each test pins one thing a presenter or a hostile user hit on the way through the tour.
All run on the FakeEngine; none needs vLLM.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import TYPE_CHECKING

import pytest
from textual import events
from textual.widgets import Input, Static
from tui_helpers import (
    SERIES_CONFIG,
    HoldingClock,
    engine_ready,
    make_app,
    reply_done,
    send_chat,
    send_series,
    settle,
    tui_config_dir,
    wait_until,
)

from engine.events import EmulationInfo, RequestBlocks, StepSample
from engine.fake import REPLY, FakeConfig, FakeEngine
from tui import axes
from tui.figures import ITL_MARK, QUEUED_MARK, TTFT_MARK, latency_figure
from tui.request_status import RequestTrack, status_of
from tui.screens.shutdown import SHUTTING_DOWN, ShuttingDownScreen
from tui.telemetry import HostWatch, LatencyPoint, Telemetry
from tui.widgets.controls_panel import concurrency_cap
from tui.widgets.count_stepper import CountStepper
from tui.widgets.field_line import SEPARATOR, pack
from tui.widgets.plot import Plot
from tui.widgets.prompt_length_slider import MAX_MODEL_LEN_CONSEQUENCE
from tui.widgets.reply_block import footer_fields

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["tui_config_dir"]

WIDE = (160, 48)
NARROW = (80, 24)
LONG_REPLY = tuple(f"w{i}" for i in range(400))


def _sample(
    step: int = 1,
    *,
    started_at: float = 1.0,
    blocks: tuple[RequestBlocks, ...] = (),
    free: int = 90,
    total: int = 90,
    block_size: int = 128,
    prefill: int = 0,
    decode: int = 0,
    running: int = 0,
    waiting: int = 0,
    duration: float = 0.1,
    preempted: tuple[str, ...] = (),
) -> StepSample:
    return StepSample(
        step=step,
        started_at=started_at,
        duration_s=duration,
        prefill_tokens=prefill,
        decode_tokens=decode,
        running=running,
        waiting=waiting,
        kv_usage=1 - free / total,
        free_blocks=free,
        total_blocks=total,
        block_size=block_size,
        blocks=blocks,
        preemptions=len(preempted),
        preempted_ids=preempted,
    )


# -- 1. Enter sends the synthetic prompt ------------------------------------------------------
async def test_enter_on_an_empty_box_sends_the_synthetic_prompt_and_the_placeholder_says_so() -> (
    None
):
    app = make_app(SERIES_CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.slider.focus()
        await pilot.press("right")  # using the slider turns the synthetic prompt on
        main.controls.slider.value = 4096
        await pilot.pause()
        assert main.chat.synthetic_tokens == 4096
        assert main.chat.input.placeholder == (
            "Enter sends a 4,096-token synthetic prompt (type to append a message)"
        )
        main.chat.input.focus()
        await pilot.press("enter")
        await reply_done(pilot)
        assert app.telemetry.points[-1].prompt_tokens == 4096
        # Turned off, the box is a chat box again and the placeholder says nothing more.
        main.controls.synthetic = False
        await pilot.pause()
        assert main.chat.synthetic_tokens is None
        assert main.chat.input.placeholder == "Message"


# -- 3. one sample for every panel ------------------------------------------------------------
async def test_after_esc_every_panel_shows_the_idle_pool() -> None:
    clock = HoldingClock(hold_after=12)
    app = make_app(FakeConfig(reply_words=LONG_REPLY), clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 5
        main.controls.slider.value = 224  # 5 × 14 blocks: one copy waits in the 64-block pool
        main.controls.query_one("#max-tokens", Input).value = "300"
        await main.send("fill it", synthetic=True)
        await wait_until(pilot, lambda: clock.holding)
        await settle(pilot)
        assert "running 4 · waiting 1" in main.engine_panel.status_text()
        await pilot.press("escape")
        clock.release()
        await reply_done(pilot)
        status = main.engine_panel.status_text()
        latest = app.telemetry.latest
        assert latest is not None
        assert latest.idle
        assert "idle" in status
        assert "running 0 · waiting 0" in status
        assert "KV 0%" in status
        assert main.engine_panel.block_map.free_blocks == 64
        assert "now 0%" in str(main.engine_panel.query_one("#kv-box").border_title)
        assert app.telemetry.kv_pct[-1] == 0.0  # the KV line comes down with the title


# -- 2. one status vocabulary -----------------------------------------------------------------
def test_a_lone_long_prompt_is_prefilling_not_waiting_for_blocks() -> None:
    # Seen: "waiting for KV blocks" for one 4,096-token prompt with 90 of 90 blocks free.
    track = RequestTrack("r1", prompt_tokens=4096, submitted_at=0.0)
    track.take(_sample(started_at=0.5, blocks=(RequestBlocks("r1", (0,) * 16, 2048),)), 2048)
    where = status_of(track, _sample(free=74), accepted=True)
    assert (where.phase, where.words) == ("prefilling", "prefilling (chunk 1 of 2)")


def test_a_copy_held_back_with_blocks_free_is_queued_by_the_token_budget() -> None:
    # Seen: 14 of 16 copies "queued for KV blocks" with 514 of 628 blocks free.
    track = RequestTrack("r1.9", prompt_tokens=4096, submitted_at=0.0)
    sample = _sample(started_at=0.5, free=514, total=628, running=2, waiting=14)
    track.take(sample, None)
    where = status_of(track, sample, accepted=True)
    assert where.words == "queued by the scheduler (token budget)"
    short = _sample(started_at=0.6, free=20, total=628)
    track.take(short, None)
    where = status_of(track, short, accepted=True)
    assert where.phase == "waiting_kv"
    assert where.words == "waiting for KV blocks (needs 32, 20 free)"


def test_preempted_then_decoding() -> None:
    track = RequestTrack("r2", prompt_tokens=100, submitted_at=0.0)
    track.take(_sample(started_at=0.1, block_size=16), 100)
    track.tokens = 5
    assert status_of(track, None, accepted=True).words == "decoding"
    track.take(_sample(started_at=0.2, block_size=16, preempted=("r2",)), None)
    assert status_of(track, None, accepted=True).words == "preempted ×1: waiting to run again"


async def test_copies_speak_the_same_words_as_the_footer() -> None:
    clock = HoldingClock(hold_after=6)
    app = make_app(FakeConfig(reply_words=LONG_REPLY), clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 3
        main.controls.slider.value = 400  # 25 blocks each: the third copy cannot start
        main.controls.query_one("#max-tokens", Input).value = "50"
        await main.send("three", synthetic=True)
        await wait_until(pilot, lambda: clock.holding)
        await settle(pilot)
        await main.current.tick()  # type: ignore[union-attr]
        text = main.chat.transcript_text()
        assert "r1.3 · waiting for KV blocks (needs 25, 12 free)" in text
        assert "queued for KV blocks" not in text
        assert "decoding" in main.current.footer_text  # type: ignore[union-attr]
        clock.release()
        await reply_done(pilot, timeout=30)


# -- 4. the K wall (pilot; the arithmetic is in test_tui_widgets) -------------------------------
async def test_typing_max_tokens_moves_the_k_wall() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        controls = app.main_screen.controls
        controls.query_one("#max-tokens", Input).value = "200"
        await pilot.pause()
        k = {w.kind: w for w in controls.slider.walls()}["kv_pool"]
        assert controls.slider.max_tokens == 200
        assert k.tokens == 1024 - 200


# -- 5. latency vs prompt tokens --------------------------------------------------------------
async def test_the_series_draws_ttft_rising_and_itl_flat_and_f9_clears_it() -> None:
    app = make_app(SERIES_CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_series(pilot)
        await settle(pilot)
        figure, summary = latency_figure(app.telemetry, 60, 12)
        assert figure is not None
        assert summary.requests == 4
        by_mark = {s.marker: s for s in figure.series}
        ttft, itl = by_mark[TTFT_MARK], by_mark[ITL_MARK]
        assert ttft.xs == itl.xs == (512.0, 1024.0, 2048.0, 4096.0)
        assert list(ttft.ys) == sorted(ttft.ys)
        assert ttft.ys[-1] > 4 * ttft.ys[0]
        assert max(itl.ys) < 1.5 * min(itl.ys)  # flat
        box = app.main_screen.engine_panel.query_one("#ttft-box")
        assert "TTFT" in str(box.border_subtitle)
        assert "median ITL" in str(box.border_subtitle)
        await pilot.press("ctrl+y")
        await settle(pilot)
        assert "log y" in str(box.border_title)
        await pilot.press("f9")
        await settle(pilot)
        assert not app.telemetry.points
        assert not app.telemetry.kv_t
        assert not app.main_screen.engine_panel.query_one("#ttft-plot", Plot).has_drawing


def test_a_queued_copy_gets_its_own_mark_and_its_queue_split_off() -> None:
    tel = Telemetry()
    tel.points.extend(
        [
            LatencyPoint("a", 512, 90.0, 37.0, 0.0, False),
            LatencyPoint("b", 4096, 1245.0, 44.0, 0.0, False),
            # Queued for 149 s: left alone it would put every other point on the axis.
            LatencyPoint("c", 4096, 150_000.0, 45.0, 148_800.0, True),
        ]
    )
    figure, summary = latency_figure(tel, 60, 12)
    assert figure is not None
    assert figure.yaxis is not None
    queued = next(s for s in figure.series if s.marker == QUEUED_MARK)
    assert queued.ys == (1200.0,)
    assert figure.yaxis.hi < 2000  # the scale is the served requests', not the queue's
    assert summary.queued == 1
    assert summary.queue_removed == 1


# -- 6. axes ----------------------------------------------------------------------------------
def test_ticks_are_round_and_land_on_rows() -> None:
    step, ticks = axes.nice_ticks(0, 24009.1, 5)
    assert step == 10000
    assert ticks == (0, 10000, 20000, 30000)
    token = axes.token_axis(4300, 60)
    assert token.labels[0] == "0"
    assert all(t == int(t) for t in token.ticks)
    assert "4,000" in token.labels
    small = axes.token_axis(3, 60)  # three tokens: no 0.5 ticks
    assert all(t == int(t) for t in small.ticks)
    ms = axes.duration_axis(437.0, 9)
    assert ms.labels[0] == "0"
    assert all(label.endswith(" ms") for label in ms.labels[1:])
    for tick in ms.ticks:
        mantissa = tick / 10 ** math.floor(math.log10(tick)) if tick else 1.0
        assert round(mantissa, 6) in (1.0, 2.0, 4.0, 5.0, 6.0, 8.0, 3.0)
    s = axes.duration_axis(171_900.0, 9)
    assert s.labels[-1].endswith(" s")
    assert s.labels[0] == "0"
    # Every tick is a whole number of rows above the bottom: an even scale.
    for rows in (4, 5, 6, 7, 9, 10, 13):
        axis = axes.duration_axis(437.0, rows)
        at = [(t - axis.lo) / (axis.hi - axis.lo) * (rows - 1) for t in axis.ticks]
        assert all(abs(r - round(r)) < 1e-6 for r in at)
        gaps = {round(b - a, 6) for a, b in itertools.pairwise(at)}
        assert len(gaps) == 1
    log = axes.log_duration_axis(20.0, 1500.0)
    assert log.labels == ("20 ms", "100 ms", "1 s", "2 s")
    assert axes.log_duration_axis(30.0, 90.0).labels == ("20 ms", "50 ms", "100 ms")


def test_kv_plot_keeps_the_last_minute() -> None:
    tel = Telemetry()
    for i in range(200):
        tel.add_sample(_sample(i + 1, started_at=float(i), duration=0.5, free=80))
    xs, _ys, _ = tel.kv_series()
    assert xs[0] == -60.0
    assert xs[-1] == 0.0
    assert len(xs) <= 62


# -- 7. a busy host ---------------------------------------------------------------------------
def test_host_watch_names_the_load_and_wild_step_times() -> None:
    watch = HostWatch(load_average=lambda: 3.4, cores=2)
    assert watch.warning() is None  # not a CPU engine: the load is not checked
    watch.check_load = True
    warning = watch.warning()
    assert warning is not None
    assert "load 3.4 on 2 cores" in warning.words
    calm = HostWatch(load_average=lambda: 0.1, cores=2)
    calm.check_load = True
    for i in range(40):
        d = 0.023 if i % 3 else 1.1  # 23 ms, then over a second
        calm.add_sample(_sample(i, decode=1, duration=d))
    words = calm.warning()
    assert words is not None
    assert "decode steps vary" in words.words


async def test_the_status_line_says_when_the_host_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.widgets import engine_panel

    monkeypatch.setattr(engine_panel, "HOST_CHECK_S", 0.0)
    app = make_app()
    app.telemetry.host = HostWatch(load_average=lambda: 7.5, cores=2)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        app.telemetry.host.check_load = True
        await send_chat(pilot, "hello")
        await reply_done(pilot)
        assert "host busy: load 7.5 on 2 cores" in app.main_screen.engine_panel.status_text()


# -- 8. the L4's walls on a CPU ---------------------------------------------------------------
L4 = EmulationInfo(gpu="L4", model="qwen2.5-7b", pool_tokens=80_384, kv_bytes_per_token=57344)


async def test_long_sends_are_estimated_and_the_copies_cap_comes_from_the_pool() -> None:
    from tui_helpers import EmulatingFakeEngine

    config = FakeConfig(max_model_len=8192, block_size=128, total_blocks=628)
    app = make_app(engine=EmulatingFakeEngine(L4, config))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        controls = main.controls
        assert controls.query_one(CountStepper).maximum == 256 == concurrency_cap(main.card)
        controls.concurrency = 19  # the README's 19 × 4,096: within reach now
        assert controls.concurrency == 19
        # The emulated model's context limit is not emulated, and M says so.
        assert "max_model_len (this model's)" in str(controls.slider.render())
        # One measured prefill step: 4,096 tokens in 4.1 s (1,000 tokens/s).
        app.telemetry.add_sample(_sample(prefill=4096, duration=4.096, total=628, free=600))
        controls.slider.value = 4096
        controls.synthetic = True
        await pilot.pause()
        main._update_estimate()
        await pilot.pause()
        estimate = str(controls.query_one("#send-estimate", Static).render())
        assert "77,824 prompt tokens ≈ 1 min on this fake" in estimate


# -- 10. polish -------------------------------------------------------------------------------
def test_footer_fields_wrap_between_fields_never_inside_one() -> None:
    fields = ("TTFT 93.0 ms", "ITL p50 37.1 ms · p99 55.0 ms", "27.4 tok/s", "hit max tokens")
    for width in range(12, 90):
        for line in pack(fields, width):
            assert all(part in fields for part in line.split(SEPARATOR))


def test_wording_agrees_with_numbers() -> None:
    from tui import format as fmt

    assert fmt.count(1, "block") == "1 block"
    assert fmt.count(2, "block") == "2 blocks"
    assert fmt.count(1, "copy", "copies") == "1 copy"
    from engine.events import RequestFinished

    one = RequestFinished("r", "length", 10, 1, 0.1, (), 0.1)
    assert "output 1 token" in " ".join(footer_fields(one))


async def test_sixteen_copies_end_as_one_summary_table_not_sixteen_footers() -> None:
    app = make_app(SERIES_CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 16
        main.controls.slider.value = 256
        main.controls.query_one("#max-tokens", Input).value = "8"
        await main.send("", synthetic=True)
        await reply_done(pilot, timeout=30)
        text = main.chat.transcript_text()
        assert "15 more copies: 15 hit max tokens" in text
        assert text.count("TTFT") <= 4  # the primary's footer and min / median / max


async def test_screenshot_goes_to_the_working_folder_when_downloads_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/Downloads there
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        app.deliver_screenshot("shot.svg")
        await wait_until(pilot, lambda: (tmp_path / "shot.svg").exists(), what="the screenshot")
        await pilot.pause(0.2)
        assert any(str(tmp_path) in n.message for n in app._notifications)


async def test_light_theme_borders_stand_out_from_the_background() -> None:
    app = make_app(theme="kvscope-light")
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        box = app.main_screen.engine_panel.query_one("#kv-box")
        border = box.styles.border_top[1]
        background = app.screen.styles.background
        # Contrast by luminance: a border at least a quarter of the way to the text.
        assert abs(border.brightness - background.brightness) > 0.25


# -- issue 8: the TUI's bad inputs ------------------------------------------------------------
async def test_an_empty_enter_with_the_slider_off_sends_nothing() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        assert not main.controls.synthetic
        main.chat.input.focus()
        await pilot.press("enter", "enter")
        await pilot.pause()
        assert main.chat.replies() == []
        assert not main.busy
        assert not app._notifications


async def test_a_20000_character_paste_is_sent_and_refused_in_words() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.chat.input.focus()
        pasted = "word " * 4000
        main.chat.input.post_message(events.Paste(pasted))
        await pilot.pause()
        assert len(main.chat.input.value) >= 19_999
        await pilot.press("enter")
        await reply_done(pilot)
        text = main.chat.transcript_text()
        assert "Prompt too long" in text
        assert "2,048" in text
        assert "Traceback" not in text
        await send_chat(pilot, "still here?")
        await reply_done(pilot)
        assert main.current is not None
        assert main.current.text == " ".join(REPLY)


async def test_twenty_fast_enters_during_a_reply_show_one_toast() -> None:
    clock = HoldingClock(hold_after=3)
    app = make_app(clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await send_chat(pilot, "one")
        await wait_until(pilot, lambda: main.busy and clock.holding)
        main.chat.input.value = "again"
        for _ in range(20):
            await pilot.press("enter")
        await pilot.pause()
        toasts = [n for n in app._notifications if "still streaming" in n.message]
        assert len(toasts) == 1
        clock.release()
        await reply_done(pilot)


@pytest.mark.parametrize("key", ["escape", "ctrl+n"])
async def test_esc_and_ctrl_n_mid_reply_give_the_blocks_back(key: str) -> None:
    clock = HoldingClock(hold_after=8)
    app = make_app(FakeConfig(reply_words=LONG_REPLY), clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.query_one("#max-tokens", Input).value = "1000"
        await send_chat(pilot, "a long story")
        await wait_until(pilot, lambda: clock.holding)
        await pilot.press(key)
        clock.release()
        await wait_until(pilot, lambda: not main.busy)
        await wait_until(
            pilot,
            lambda: app.telemetry.latest is not None and app.telemetry.latest.free_blocks == 64,
            what="the blocks to come back",
        )
        await settle(pilot)
        assert main.engine_panel.block_map.free_blocks == 64
        await send_chat(pilot, "next")
        await reply_done(pilot, timeout=30)
        assert main.current is not None
        assert main.current.primary.finished is not None


class CountingShutdown(FakeEngine):
    def __init__(self, config: FakeConfig | None = None, clock: HoldingClock | None = None) -> None:
        super().__init__(config, clock)
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1
        super().shutdown()


async def test_ctrl_q_mid_reply_says_it_is_shutting_down_then_exits() -> None:
    clock = HoldingClock(hold_after=8)
    engine = CountingShutdown(FakeConfig(reply_words=LONG_REPLY), clock)
    app = make_app(engine=engine)
    seen: list[str] = []
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "a long story")
        await wait_until(pilot, lambda: clock.holding)
        original = engine.shutdown

        def slow_shutdown() -> None:
            # What the user sees while the engine stops.
            screen = app.screen
            seen.append(type(screen).__name__)
            original()

        engine.shutdown = slow_shutdown  # type: ignore[method-assign]
        await pilot.press("ctrl+q")
        await pilot.pause(0.2)
        clock.release()
    assert seen == [ShuttingDownScreen.__name__]
    assert engine.shutdowns == 1
    assert app.return_code in (None, 0)
    assert SHUTTING_DOWN == "shutting down the engine…"


async def test_the_slider_at_m_exactly_is_refused_before_a_prompt_is_built() -> None:
    class Counting(FakeEngine):
        built = 0

        def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0):  # type: ignore[no-untyped-def]
            Counting.built += 1
            return super().synthetic_prompt(num_tokens, suffix, seed)

    app = make_app(engine=Counting())
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.slider.value = 2048  # exactly max_model_len
        main.controls.synthetic = True
        await pilot.pause()
        assert main.controls.slider.has_class("-past-wall")
        assert MAX_MODEL_LEN_CONSEQUENCE in str(main.controls.slider.render())
        main.chat.input.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert Counting.built == 0
        assert not main.busy
        error = str(main.controls.query_one("#slider-error").render())
        assert "2,048 tokens" in error
        assert "max_model_len) is 2,048" in error


async def test_an_unknown_theme_never_rewrites_settings_and_unknown_keys_survive(
    tui_config_dir: Path,
) -> None:
    tui_config_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (test set-up)
    path = tui_config_dir / "settings.json"
    original = json.dumps({"theme": "no-such-theme", "future_key": [1, 2], "cursor_blink": True})
    path.write_text(original)
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await pilot.pause(0.3)
    assert path.read_text() == original  # untouched: the app changed nothing
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        app.theme = "phosphor"  # a real choice: only that key changes
        await pilot.pause(0.3)
    saved = json.loads(path.read_text())
    assert saved == {"theme": "phosphor", "future_key": [1, 2], "cursor_blink": True}


def test_copies_cap_stays_16_for_a_small_pool() -> None:
    from engine.events import ModelCard

    card = ModelCard("m", "m", "bf16", 1, 1, 1, 2, 4096, 128, 10, "cpu")
    assert concurrency_cap(card) == 16
    assert concurrency_cap(dataclasses.replace(card, total_blocks=628)) == 256
