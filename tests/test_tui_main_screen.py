"""The main screen in pilot tests, a part at a time: the chat box, the slider's walls, the
engine panel, copies, stopping mid-reply, and themes and settings.

Each test pins one thing a presenter or a hostile user hit on the way through the demo (the
TUI's share of the bad-input matrix included). All run on the FakeEngine; none needs vLLM.
The widgets and pure helpers alone are tested in test_tui_widgets.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from textual import events
from textual.widgets import Input, Static
from tui_helpers import (
    NARROW,
    SERIES_CONFIG,
    WIDE,
    HoldingClock,
    engine_ready,
    make_app,
    notified,
    reply_done,
    send_chat,
    send_series,
    settle,
    step_sample,
    wait_until,
)

from engine.events import EmulationInfo
from engine.fake import REPLY, FakeConfig, FakeEngine
from tui.figures import ITL_MARK, TTFT_MARK, latency_figure
from tui.screens.shutdown import SHUTTING_DOWN, ShuttingDownScreen
from tui.telemetry.host_watch import HostWatch
from tui.widgets.controls_panel import concurrency_cap
from tui.widgets.count_stepper import CountStepper
from tui.widgets.plot import Plot
from tui.widgets.prompt_length_slider import MAX_MODEL_LEN_CONSEQUENCE

if TYPE_CHECKING:
    from pathlib import Path

LONG_REPLY = tuple(f"w{i}" for i in range(400))


# -- the chat box: what Enter sends -----------------------------------------------------------
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
        assert main.chat.input.placeholder == ("Enter: 4,096 synthetic tokens (+ what you type)")
        main.chat.input.focus()
        await pilot.press("enter")
        await reply_done(pilot)
        assert app.telemetry.points[-1].prompt_tokens == 4096
        # Turned off, the box is a chat box again and the placeholder says nothing more.
        main.controls.synthetic = False
        await pilot.pause()
        assert main.chat.synthetic_tokens is None
        assert main.chat.input.placeholder == "Message"


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


# -- the prompt-length slider's walls and the send estimate -----------------------------------
# (The walls' arithmetic is tested on the widget alone, in test_tui_widgets.py.)
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
        controls.concurrency = 19  # docs/prefill-vs-decode.md's 19 × 4,096: within reach now
        assert controls.concurrency == 19
        # The emulated model's context limit is not emulated, and M says so.
        assert "max_model_len (this model's)" in str(controls.slider.render())
        # Two measured prefill steps, 2,048 and 4,096 tokens at 1,000 tokens/s.
        app.telemetry.add_sample(step_sample(prefill=2048, duration=2.048, total=628, free=600))
        app.telemetry.add_sample(step_sample(prefill=4096, duration=4.096, total=628, free=600))
        controls.slider.value = 4096
        controls.synthetic = True
        await pilot.pause()
        main._update_estimate()
        await pilot.pause()
        estimate = str(controls.query_one("#send-estimate", Static).render())
        assert "77,824 prompt tokens ≈ 1 min on this fake" in estimate


# -- the engine panel: status line, pool and latency plot -------------------------------------
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


async def test_the_series_draws_ttft_rising_and_itl_flat_and_f9_clears_it() -> None:
    app = make_app(SERIES_CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_series(pilot)
        await settle(pilot)
        figure, summary = latency_figure(app.telemetry, 60, 12)
        assert figure is not None
        assert summary.requests == 4
        # Two strips where TTFT outgrows ITL tenfold: the ITL series is in the lower one.
        strips = (figure, figure.below) if figure.below else (figure,)
        by_mark = {s.marker: s for f in strips for s in f.series}
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


# -- copies in the transcript -----------------------------------------------------------------
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


# -- stopping mid-reply: Esc, ctrl+n, ctrl+q --------------------------------------------------
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


# -- themes, settings and screenshots ---------------------------------------------------------
async def test_light_theme_borders_stand_out_from_the_background() -> None:
    app = make_app(theme="kvscope-light")
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        box = app.main_screen.engine_panel.query_one("#kv-box")
        border = box.styles.border_top[1]
        background = app.screen.styles.background
        # Contrast by luminance: a border at least a quarter of the way to the text.
        assert abs(border.brightness - background.brightness) > 0.25


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
        await wait_until(
            pilot, lambda: json.loads(path.read_text())["theme"] == "phosphor", what="the save"
        )
    saved = json.loads(path.read_text())
    assert saved == {"theme": "phosphor", "future_key": [1, 2], "cursor_blink": True}


async def test_screenshot_goes_to_kvscopes_folder_not_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not ~/Downloads (which may not exist) and not the working folder (in a clone of
    kvscope, the repository): kvscope's own screenshots folder, said in the toast; the
    working folder only when that one cannot be written."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/Downloads there
    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        app.deliver_screenshot("shot.svg")
        shot = data / "kvscope" / "screenshots" / "shot.svg"
        await wait_until(pilot, shot.exists, what="the screenshot")
        await notified(pilot, str(shot.parent))
        assert not (work / "shot.svg").exists()
        # That folder not writable (a file in its place): the working folder takes it.
        (data / "kvscope" / "screenshots" / "shot.svg").unlink()
        (data / "kvscope" / "screenshots").rmdir()
        (data / "kvscope" / "screenshots").write_text("not a folder")
        app.deliver_screenshot("second.svg")
        await wait_until(pilot, (work / "second.svg").exists, what="the fallback screenshot")
