"""Pilot tests of the kvscope app, driven by the deterministic FakeEngine."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import TYPE_CHECKING

from rich.style import Style
from textual.widgets import Input, Switch
from tui_helpers import (
    NARROW,
    WIDE,
    HoldingClock,
    engine_ready,
    make_app,
    notified,
    palette_offers,
    palette_open,
    reply_done,
    send_chat,
    settle,
    wait_until,
)

from engine.errors import KvPoolTooSmall
from engine.events import LoadProgress, ModelCard, ProgressCallback, StepSample
from engine.fake import REPLY, FakeConfig, FakeEngine
from tui.app import KvscopeApp
from tui.messages import StepSampled
from tui.screens.help import HelpScreen
from tui.settings import AppSettings
from tui.widgets.kv_block_map import USED
from tui.widgets.plot import Plot
from tui.widgets.prompt_length_slider import KV_POOL_CONSEQUENCE, MAX_MODEL_LEN_CONSEQUENCE
from tui.widgets.token_latency_view import TokenLatencyView, latency_level

if TYPE_CHECKING:
    import pytest

LONG_REPLY = tuple(f"w{i}" for i in range(400))


async def test_reply_streams_token_by_token_then_shows_its_footer() -> None:
    clock = HoldingClock(hold_after=6)
    app = make_app(clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "What is the KV cache?")
        main = app.main_screen
        await wait_until(
            pilot, lambda: main.current is not None and main.current.primary.received == 6
        )
        reply = main.current
        assert reply is not None
        # Mid-stream: exactly the first six words, and the footer says it is streaming.
        assert reply.text == " ".join(REPLY[:6])
        assert main.busy
        clock.release()
        await reply_done(pilot)
        assert reply.text == " ".join(REPLY)
        footer = main.chat.transcript_text()
        assert "TTFT" in footer
        assert "ITL p50" in footer
        assert "p99" in footer
        assert "tok/s" in footer
        assert f"output {len(REPLY)} tok" in footer
        assert "done" in footer
        # The TTFT scatter and the ITL plot have their data.
        assert len(app.telemetry.points) == 1
        assert len(app.telemetry.itl_ms) == len(REPLY) - 1


async def test_second_turn_carries_the_history() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "first question")
        await reply_done(pilot)
        await send_chat(pilot, "second question")
        await reply_done(pilot)
        main = app.main_screen
        assert [m.role for m in main.conversation.messages] == ["user", "assistant"] * 2
        first, second = app.telemetry.points
        assert second.prompt_tokens > first.prompt_tokens + len(
            REPLY
        )  # the prompt now holds the first exchange


async def test_slider_past_max_model_len_shows_the_engines_error_then_chat_still_works() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        slider = main.controls.slider
        slider.focus()
        await pilot.press("end")  # 1.25 × max_model_len: past every wall
        await settle(pilot)
        assert slider.value > 2048
        assert slider.has_class("-past-wall")
        ruler = str(slider.render())
        assert MAX_MODEL_LEN_CONSEQUENCE in ruler
        assert KV_POOL_CONSEQUENCE in ruler
        assert main.controls.synthetic  # using the slider turns the synthetic prompt on

        main.controls.query_one("#send-synthetic").focus()
        await pilot.press("enter")
        await reply_done(pilot)
        error = str(main.controls.query_one("#slider-error").render())
        assert "Prompt too long" in error
        assert f"{slider.value:,} tokens" in error
        assert "max_model_len) is 2,048" in error
        assert main.engine_state == "ready"
        assert not main.busy

        main.controls.query_one("#synthetic-switch", Switch).value = False
        await send_chat(pilot, "a normal message")
        await reply_done(pilot)
        assert main.current is not None
        assert main.current.text == " ".join(REPLY)


async def test_escape_stops_a_reply_and_its_blocks_come_back() -> None:
    clock = HoldingClock(hold_after=8)
    app = make_app(FakeConfig(reply_words=LONG_REPLY), clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.query_one("#max-tokens", Input).value = "1000"
        await send_chat(pilot, "tell me a long story")
        await wait_until(
            pilot, lambda: main.current is not None and main.current.primary.received == 8
        )
        await settle(pilot)
        assert main.engine_panel.block_map.free_blocks < 64  # the request holds blocks
        await pilot.press("escape")
        clock.release()
        await reply_done(pilot)
        reply = main.current
        assert reply is not None
        assert reply.primary.finished is not None
        assert reply.primary.finished.reason == "abort"
        assert 8 <= reply.primary.finished.output_tokens < 1000
        assert "stopped by you" in main.chat.transcript_text()
        latest = app.telemetry.latest
        assert latest is not None
        assert latest.blocks == ()
        assert latest.free_blocks == 64
        assert main.engine_panel.block_map.free_blocks == 64
        # A stopped reply is still part of the conversation (it is what the user saw).
        assert len(main.conversation.messages) == 2


async def test_block_map_shows_the_blocks_the_engine_reports() -> None:
    clock = HoldingClock(hold_after=4)
    app = make_app(clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        controls = main.controls
        controls.concurrency = 2
        controls.slider.value = 200
        controls.synthetic = True
        await pilot.pause()
        await main.send("two copies", synthetic=True)
        await wait_until(
            pilot,
            lambda: main.current is not None and all(c.received == 4 for c in main.current.copies),
        )
        await settle(pilot)
        sample = app.telemetry.latest
        assert sample is not None
        assert {b.request_id for b in sample.blocks} == {"r1", "r1.2"}
        block_map = main.engine_panel.block_map
        text = block_map.as_text()
        width = block_map.content_size.width
        held = set()
        for req in sample.blocks:
            style = block_map.get_component_rich_style(
                f"kv-block-map--req-{block_map.colour_index(req.request_id)}"
            )
            for block_id in req.block_ids:
                held.add(block_id)
                assert block_map.owner_of(block_id) == req.request_id
                # One character per block: row block_id // width, column block_id % width.
                offset = (block_id // width) * (width + 1) + block_id % width
                assert text.plain[offset] == USED
                spans = [s for s in text.spans if s.start <= offset < s.end]
                assert spans
                assert spans[-1].style == style
        assert block_map.colour_index("r1") != block_map.colour_index("r1.2")
        for block_id in set(range(sample.total_blocks)) - held:
            assert block_map.owner_of(block_id) is None
        assert block_map.free_blocks == sample.free_blocks
        clock.release()
        await reply_done(pilot)


async def test_the_app_survives_engine_death_and_keeps_the_transcript() -> None:
    # The first reply takes ~53 steps; the engine dies at step 80, inside the second one.
    app = make_app(FakeConfig(die_at_step=80))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await send_chat(pilot, "first")
        await reply_done(pilot)
        await send_chat(pilot, "second")
        await reply_done(pilot)
        assert main.engine_state == "dead"
        text = main.chat.transcript_text()
        assert "first" in text
        assert "second" in text
        assert " ".join(REPLY) in text
        assert "The engine stopped: scripted failure" in text
        status = str(main.chat.status.query_one("#engine-status-text").render())
        assert "transcript is kept" in status
        assert "ctrl+r" in status
        assert "Traceback" not in text + status
        # Sending now explains instead of failing.
        await send_chat(pilot, "third")
        await pilot.pause()
        assert main.chat.input.value == "third"  # the message is kept for later
        await pilot.press("ctrl+r")
        await engine_ready(pilot)
        assert main.engine_state == "ready"
        await send_chat(pilot, "after restart")
        await reply_done(pilot)
        assert main.current is not None
        assert main.current.text == " ".join(REPLY)
        assert "first" in main.chat.transcript_text()


class FailingOnceEngine(FakeEngine):
    """Start-up fails once with a typed error, then works: as after fixing a flag."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        self.attempts += 1
        if self.attempts == 1:
            raise KvPoolTooSmall(2 * 1024**3, 1024**3, 4096, 8192)
        return super().start(progress)


async def test_start_failure_is_shown_in_words_and_can_be_retried() -> None:
    engine = FailingOnceEngine()
    app = make_app(engine=engine)
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        assert main.engine_state == "failed"
        status = str(main.chat.status.query_one("#engine-status-text").render())
        assert KvPoolTooSmall(2 * 1024**3, 1024**3, 4096, 8192).plain() in status
        assert "Traceback" not in status
        await send_chat(pilot, "hello?")  # usable: the message waits in the box
        await pilot.pause()
        assert main.chat.input.value == "hello?"
        await pilot.press("ctrl+r")
        await engine_ready(pilot)
        assert main.engine_state == "ready"
        assert engine.attempts == 2
        await pilot.press("enter")
        await reply_done(pilot)
        assert main.current is not None
        assert main.current.text == " ".join(REPLY)


class SlowThreadedEngine(FakeEngine):
    """Like the real engine: a slow start, and step samples from another thread."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        if progress:
            progress(LoadProgress("loading weights", 0.4))
        self.gate.wait(10)
        return super().start(progress)

    def add_step_listener(self, listener):  # type: ignore[no-untyped-def]
        def from_a_thread(sample: StepSample) -> None:
            t = threading.Thread(target=listener, args=(sample,))
            t.start()
            t.join()

        return super().add_step_listener(from_a_thread)


async def test_the_app_is_usable_while_a_slow_engine_loads_and_takes_samples_from_threads() -> None:
    gate = threading.Event()
    app = make_app(engine=SlowThreadedEngine(gate))
    async with app.run_test(size=WIDE) as pilot:
        main = app.main_screen
        await wait_until(pilot, lambda: main.chat.status.progress is not None)
        await settle(pilot)
        assert main.engine_state == "loading"
        status = str(main.chat.status.query_one("#engine-status-text").render())
        assert "loading weights" in status
        assert "loading" in str(main.controls.query_one("ModelCardView").render())
        await pilot.press(*"typing works")  # the UI answers while start() blocks a thread
        assert main.chat.input.value == "typing works"
        gate.set()
        await engine_ready(pilot)
        assert main.engine_state == "ready"
        await pilot.press("enter")
        await reply_done(pilot)
        assert app.telemetry.steps_version >= len(REPLY)  # samples arrived from threads
        assert main.current is not None
        assert main.current.text == " ".join(REPLY)


async def test_latency_colours_mark_the_stalled_token() -> None:
    app = make_app(FakeConfig(stalls=((10, 0.5),)))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "show me a stall")
        await reply_done(pilot)
        main = app.main_screen
        reply = main.current
        assert reply is not None
        view = reply.query_one(TokenLatencyView)
        assert not view.display or view.region.height == 0
        await pilot.press("ctrl+l")
        await settle(pilot)
        assert main.chat.has_class("-latency")
        assert view.region.height > 0
        levels = [latency_level(t, view._median) for t in reply.tokens]
        assert levels[0] == "first"
        assert levels[10] == "stall"
        assert levels.count("stall") == 1
        # The rendered line with token 10 carries the stall colour.
        stall_style = view.get_component_rich_style("token-latency-view--stall")
        rendered = [seg for y in range(view.region.height) for seg in view.render_line(y)]
        stalled = [seg for seg in rendered if seg.text.strip() == REPLY[10]]
        assert stalled
        assert stalled[0].style is not None
        assert stall_style.color == stalled[0].style.color
        await pilot.press("ctrl+l")
        await settle(pilot)
        assert not main.chat.has_class("-latency")


async def test_new_chat_clears_the_transcript_and_history() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "remember me")
        await reply_done(pilot)
        main = app.main_screen
        await pilot.press("ctrl+n")
        await settle(pilot)
        assert main.conversation.messages == []
        assert main.chat.replies() == []
        assert "remember me" not in main.chat.transcript_text()


def _drawn_colours(plot: Plot) -> set[tuple[int, int, int]]:
    """The RGB colours actually present in a plot's last drawing."""
    text = plot.render()
    out = set()
    for span in text.spans:
        style = span.style
        if isinstance(style, Style) and style.color is not None and style.color.triplet:
            out.add(tuple(style.color.triplet))
    return out  # type: ignore[return-value]


async def test_theme_switch_changes_the_colours() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await send_chat(pilot, "colour me")
        await reply_done(pilot)
        await app.main_screen.redraw()
        plot = app.main_screen.engine_panel.query_one("#kv-plot", Plot)
        dark_series = dict(plot.palette())["series"]
        assert dark_series in _drawn_colours(plot)
        assert app.theme == "kvscope-dark"
        block_map = app.main_screen.engine_panel.block_map
        before_bg = app.screen.styles.background
        before_req = block_map.get_component_rich_style("kv-block-map--req-0").color
        app.theme = "kvscope-light"
        await settle(pilot)
        assert app.screen.styles.background != before_bg
        assert block_map.get_component_rich_style("kv-block-map--req-0").color != before_req
        # The plots were redrawn in the new colours too, with no new data to prompt it.
        await app.main_screen.redraw()
        light_series = dict(plot.palette())["series"]
        assert light_series != dark_series
        drawn = _drawn_colours(plot)
        assert light_series in drawn
        assert dark_series not in drawn


async def test_theme_from_the_palette_is_remembered(tui_config_dir) -> None:  # type: ignore[no-untyped-def]
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"theme")
        await palette_offers(pilot, "Theme")
        await pilot.press("enter")  # "Theme - Change the current theme"
        await palette_open(pilot, "Search for themes…")
        await pilot.press(*"phosphor")
        await palette_offers(pilot, "phosphor")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.theme == "phosphor", what="the theme to change")
    saved = json.loads((tui_config_dir / "settings.json").read_text())
    assert saved["theme"] == "phosphor"
    assert AppSettings.load().theme == "phosphor"
    # And a new app starts in it.
    again = make_app()
    async with again.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert again.theme == "phosphor"


async def test_an_unknown_saved_theme_falls_back_with_a_notice(tui_config_dir) -> None:  # type: ignore[no-untyped-def]
    tui_config_dir.mkdir(parents=True, exist_ok=True)
    (tui_config_dir / "settings.json").write_text(json.dumps({"theme": "no-such-theme"}))
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        # Seen to fail after one fixed pause in a fresh-clone run under load: see notified.
        await notified(pilot, "no-such-theme")
        assert app.theme == "kvscope-dark"


async def test_a_notice_raised_at_the_start_is_found_after_it_expired(  # type: ignore[no-untyped-def]
    tui_config_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a loaded host does to the test above: the start takes longer than a notice lives
    # (fresh clone AB, a busy loop per core), and Textual drops it before the test looks.
    monkeypatch.setattr(KvscopeApp, "NOTIFICATION_TIMEOUT", 0.01)
    tui_config_dir.mkdir(parents=True, exist_ok=True)
    (tui_config_dir / "settings.json").write_text(json.dumps({"theme": "no-such-theme"}))
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause(0.05)  # five times its life: gone from the screen
        assert not [n for n in app._notifications if "no-such-theme" in n.message]
        message = await notified(pilot, "no-such-theme", severity="warning")
        assert "using kvscope-dark" in message


async def test_help_screen_lists_the_keys_and_closes() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = " ".join(k for _, rows in app.screen.key_sections() for k, _ in rows)
        for expected in ("escape", "ctrl+n", "ctrl+l", "ctrl+r", "f5", "f1 / ?", "pageup"):
            assert expected in keys
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        app.main_screen.controls.slider.focus()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


async def test_narrow_layout_switches_panels_with_tabs() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        assert main.has_class("-narrow")
        assert main.chat.region.width > 0
        assert main.engine_panel.region.width == 0
        await pilot.press("f3")
        await settle(pilot)
        assert main.engine_panel.region.width == 80
        assert main.chat.region.width == 0
        await pilot.press("f4")
        await settle(pilot)
        assert main.controls.region.width == 80
        assert app.focused is main.controls.slider
        await pilot.press("f2")
        await settle(pilot)
        assert main.chat.region.width == 80
        assert app.focused is main.chat.input


async def test_sending_while_a_reply_streams_is_refused_politely() -> None:
    clock = HoldingClock(hold_after=3)
    app = make_app(clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await send_chat(pilot, "one")
        await wait_until(pilot, lambda: main.busy and clock.holding)
        await send_chat(pilot, "two")
        await pilot.pause()
        assert main.chat.input.value == "two"
        assert len(main.chat.replies()) == 1
        clock.release()
        await reply_done(pilot)


async def test_concurrent_copies_each_stream_and_finish() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 3
        await send_chat(pilot, "three at once")
        await reply_done(pilot)
        reply = main.current
        assert reply is not None
        assert [c.request_id for c in reply.copies] == ["r1", "r1.2", "r1.3"]
        assert all(c.finished is not None and c.finished.reason == "stop" for c in reply.copies)
        assert len(app.telemetry.points) == 3
        text = main.chat.transcript_text()
        assert "r1.2 · TTFT" in text
        assert "r1.3 · TTFT" in text


async def test_preemption_is_counted_when_copies_overfill_the_pool() -> None:
    # 4 copies of a 200-token prompt need 4 × 13 blocks to start and grow past 64 blocks.
    app = make_app(FakeConfig(reply_words=LONG_REPLY))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.concurrency = 4
        main.controls.slider.value = 224
        main.controls.query_one("#max-tokens", Input).value = "120"
        await main.send("fill the pool", synthetic=True)
        await reply_done(pilot, timeout=30)
        assert app.telemetry.preemptions_total > 0
        assert "preempted ×" in str(main.engine_panel.query_one("#kv-box").border_title)


def test_step_listener_only_posts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The step thread calls the listener: it may only hand the sample to the app's loop
    # (widgets and telemetry belong to the loop), and must be safe to call once that loop
    # is gone (engine thread races).
    app = make_app()
    main = app.main_screen
    sample = StepSample(1, 0.0, 0.01, 10, 0, 1, 0, 0.1, 60, 64, 16)
    posted: list[object] = []

    def post(message: object) -> bool:
        posted.append(message)
        return True

    monkeypatch.setattr(main, "post_message", post)
    main._on_step(sample)
    assert len(posted) == 1
    assert isinstance(posted[0], StepSampled) and posted[0].sample is sample
    assert app.telemetry.latest is None  # taken in by the loop, when the message arrives

    def closed(message: object) -> bool:
        posted.append(message)
        raise RuntimeError("Event loop is closed")

    monkeypatch.setattr(main, "post_message", closed)
    main._on_step(sample)  # nobody is watching any more: nothing to tell, nothing raised
    assert len(posted) == 2
    assert app.telemetry.latest is None


async def test_demo_mode_saves_a_screenshot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from engine.clock import RealClock

    fast = FakeConfig(decode_step_s=0.002, prefill_base_s=0.001)
    app = make_app(engine=FakeEngine(fast, clock=RealClock()))
    from cli.demo import run_demo

    app.script = run_demo
    app.screenshot_path = str(tmp_path / "demo.svg")
    async with app.run_test(size=WIDE) as pilot:
        # A hang guard: the script's steps run on the real clock, slower on a loaded host.
        await wait_until(pilot, lambda: (tmp_path / "demo.svg").exists(), timeout=120)
        await asyncio.sleep(0)
    svg = (tmp_path / "demo.svg").read_text()
    # The chat turn is r1, the series' one length that fits this fake is r2, and the two
    # copies streaming in the picture are r3 and r3.2.
    assert "<svg" in svg
    assert "r3.2" in svg
