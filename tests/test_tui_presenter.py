"""The presenter's experience (issue #23, items 5, 7-10): preemption explained, spikes that
name a busy host, keys for the slider, focus you can see, keystrokes kept, folded noise.

All on the FakeEngine on virtual time: deterministic, no vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from textual import events
from textual.widgets import Input
from tui_helpers import NARROW, WIDE, engine_ready, make_app, reply_done, settle

from engine.events import RequestBlocks, RequestWork, StepSample, TokenEvent
from engine.fake import FakeConfig
from tui.app import KvscopeApp
from tui.telemetry.buffers import Telemetry
from tui.telemetry.host_watch import HostWatch
from tui.widgets.copies_table import CopyState, copies_table
from tui.widgets.prompt_length_slider import consequences, walls_for

if TYPE_CHECKING:
    from textual.pilot import Pilot

TINY_POOL = FakeConfig(total_blocks=10, block_size=128, max_model_len=2048)
"""The issue's setup: a 10-block pool that 4 copies of 256 + 32 tokens overfill."""


def _app(pilot: Pilot[int]) -> KvscopeApp:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    return app


async def _four_copies(pilot: Pilot[int], max_tokens: int = 32) -> None:
    await engine_ready(pilot)
    main = _app(pilot).main_screen
    main.controls.concurrency = 4
    main.controls.slider.value = 256
    main.controls.synthetic = True
    main.controls.query_one("#max-tokens", Input).value = str(max_tokens)
    await pilot.pause()
    await main.send("", synthetic=True)
    await reply_done(pilot)


# -- item 5: preemption explained ------------------------------------------------------------
async def test_a_preemption_is_explained_with_its_numbers_and_its_cost() -> None:
    app = make_app(TINY_POOL)
    async with app.run_test(size=WIDE) as pilot:
        await _four_copies(pilot)
        tel = app.telemetry
        assert tel.preemptions_total == 1
        note = app.main_screen.engine_panel.preemption_text()
        # Step 1 prefilled all four (2 blocks each, 2 free); at token 257 three needed a
        # block each: vLLM evicted the newest, r1.4, and its 2 blocks came back.
        assert note == (
            "⚠ Step 2 preempted r1.4: the running requests needed more KV blocks than were "
            "free (2 of 10), so vLLM evicted the newest; its 2 blocks came back. Its 256 "
            "prompt tokens and 1 output token are recomputed when it runs again. "
            "Cost: next token 660 ms later, 256 tokens recomputed in 1 step (35.6 ms)."
        )
        # The KV box says it happened even after the mark has left the 60 s window.
        title = str(app.main_screen.engine_panel.query_one("#kv-box").border_title)
        assert "preempted ×1, last step 2" in title


def test_the_kv_title_says_a_preemption_scrolled_off_the_plot() -> None:
    tel = Telemetry()
    held = (RequestBlocks("r1", (0, 1), 256), RequestBlocks("r2", (2, 3), 256))
    tel.add_sample(_sample(1, 0.0, held, free=0))
    tel.add_sample(_sample(2, 1.0, held[:1], free=2, preempted=("r2",)))
    tel.add_sample(_sample(3, 100.0, held[:1], free=2))
    from tui.widgets.engine_panel import EnginePanel

    panel = EnginePanel(tel)
    assert panel._preempt_title() == " · preempted ×1, last step 2 (2 min ago, off the plot)"
    assert tel.preemption is not None
    assert tel.preemption.blocks_back == 2
    assert tel.preemption.newest


def _sample(
    step: int,
    at: float,
    blocks: tuple[RequestBlocks, ...],
    *,
    free: int,
    preempted: tuple[str, ...] = (),
    duration: float = 0.02,
) -> StepSample:
    return StepSample(
        step=step,
        started_at=at,
        duration_s=duration,
        prefill_tokens=0,
        decode_tokens=len(blocks),
        running=len(blocks),
        waiting=len(preempted),
        kv_usage=1 - free / 4,
        free_blocks=free,
        total_blocks=4,
        block_size=128,
        blocks=blocks,
        preemptions=len(preempted),
        preempted_ids=preempted,
        work=tuple(RequestWork(b.request_id, 0, 1) for b in blocks),
    )


async def test_the_copies_table_is_not_cut_at_either_size() -> None:
    for size in (WIDE, NARROW):
        app = make_app(TINY_POOL)
        async with app.run_test(size=size) as pilot:
            await _four_copies(pilot)
            reply = app.main_screen.chat.replies()[-1]
            table = reply.query_one(".reply-copies")
            lines = [s.text for s in table.render_lines(table.region.reset_offset)]
            shown = "\n".join(lines)
            assert "…" not in shown, shown
            assert "TTFT ms" in shown
            assert "preempted" in shown
            assert "×1" in shown


def test_the_copies_table_fits_55_columns() -> None:
    from rich.console import Console

    from engine.events import RequestFinished

    copies = []
    for k, n in ((2, 0), (3, 12), (4, 1)):
        copy = CopyState(f"r1.{k}")
        copy.finished = RequestFinished.from_times(
            f"r1.{k}",
            "length",
            prompt_tokens=256,
            submitted_at=0.0,
            token_times=[10.0 + i * 0.02 for i in range(256)],
            now=15.0,
            preemptions=n,
        )
        copies.append(copy)
    table, _ = copies_table(copies)
    console = Console(width=55, record=True)
    console.print(table)
    assert "…" not in console.export_text()


# -- item 7: spikes that name a busy host ------------------------------------------------------
def test_a_slow_decode_step_names_the_busy_host_without_repeating_the_figure() -> None:
    host = HostWatch(load_average=lambda: 5.0, cores=2)
    host.check_load = True
    tel = Telemetry(host=host)
    tel.track_request("r7")
    t = 0.0
    for step in range(1, 213):
        duration = 4.266 if step == 213 - 1 else 0.023
        tel.add_sample(_decode(step, t, duration))
        t += duration
        tel.add_token(TokenEvent("r7", step - 1, (1,), "x", step, t, duration))
    words = tel.explain_token(211)
    assert words == (
        "token 212 of 212 waited 4,266 ms: the host was busy (185× a usual 23.0 ms step; "
        "load 5.0 on 2 cores); step 212 decoded 1 request and took it all"
    )
    assert words.count("4,266") == 1


def _decode(step: int, at: float, duration: float) -> StepSample:
    return StepSample(
        step=step,
        started_at=at,
        duration_s=duration,
        prefill_tokens=0,
        decode_tokens=1,
        running=1,
        waiting=0,
        kv_usage=0.1,
        free_blocks=90,
        total_blocks=100,
        block_size=16,
        blocks=(RequestBlocks("r7", (0,), step),),
        work=(RequestWork("r7", 0, 1),),
    )


async def test_the_spike_line_stays_when_the_focus_moves_on() -> None:
    app = make_app(TINY_POOL)
    async with app.run_test(size=WIDE) as pilot:
        await _four_copies(pilot)
        await pilot.press("f6")  # the latency box takes the focus and explains a token
        await settle(pilot)
        from tui.widgets.latency_box import LatencyBox

        box = app.main_screen.engine_panel.query_one(LatencyBox)
        words = box.spike_text
        assert words.startswith("r1: token ")
        app.main_screen.chat.input.focus()
        await settle(pilot)
        assert not box.has_focus
        assert box.spike_text == words
        assert box.query_one("#spike-line").display


# -- item 8: a presenter's keyboard ------------------------------------------------------------
async def test_keys_turn_the_slider_on_and_walk_its_length() -> None:
    app = make_app(FakeConfig(max_model_len=8192, total_blocks=1024))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        controls = main.controls
        controls.slider.value = 512
        assert not controls.synthetic
        await pilot.press("f7")  # from the message box
        assert controls.synthetic
        await pilot.press("ctrl+up", "ctrl+up")
        assert controls.slider.value == 2048
        await pilot.press("ctrl+down")
        assert controls.slider.value == 1024
        await pilot.press("f7")
        assert not controls.synthetic
        # Space on the focused slider toggles it too.
        controls.slider.focus()
        await pilot.press("space")
        assert controls.synthetic
        await pilot.press("space")
        assert not controls.synthetic
        # The footer shows the keys; F1 lists them.
        footer_keys = {key for key, b in main.active_bindings.items() if b.binding.show}
        assert {"f7", "ctrl+up", "ctrl+down"} <= footer_keys
        await pilot.press("f1")
        await settle(pilot)
        from tui.screens.help import HelpScreen

        assert isinstance(app.screen, HelpScreen)
        sections = dict(app.screen.key_sections())
        rows = dict(sections["Main screen"])
        assert rows["f7"] == "Slider on/off"
        assert rows["ctrl+up"] == "Prompt ×2"
        assert dict(sections["Prompt-length slider (when focused)"])["space"] == "Slider on / off"


async def test_typing_fast_into_max_tokens_keeps_every_key() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        field = app.main_screen.controls.query_one("#max-tokens", Input)
        await pilot.press("f4")
        field.focus()
        field.value = ""
        await pilot.pause()
        # All three keys queued at once, as a fast typist's arrive, before any is handled.
        for key in "256":
            app.post_message(_key(key))
        await settle(pilot)
        assert field.value == "256"
        assert app.main_screen.controls.max_tokens == 256


def _key(char: str) -> events.Key:
    return events.Key(char, char)


async def test_every_focusable_widget_shows_its_focus() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        screen = app.main_screen
        unseen = []
        for widget in list(screen.focus_chain):
            screen.set_focus(None)
            await settle(pilot)
            before = _cells(app, widget)
            widget.focus()
            await settle(pilot)
            if _cells(app, widget) == before:
                unseen.append(widget)
        assert not unseen, f"no visible focus on {unseen}"


def _cells(app: KvscopeApp, widget: object) -> list[tuple[str, str]]:
    from textual.widget import Widget

    assert isinstance(widget, Widget)
    region = widget.region
    strips = app.screen._compositor.render_strips()
    out: list[tuple[str, str]] = []
    for y in range(region.y, region.bottom):
        strip = strips[y].crop(region.x, region.right)
        out += [(seg.text, str(seg.style)) for seg in strip]
    return out


async def test_page_down_scrolls_the_engine_tab_at_80x24() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await pilot.press("f3")
        main.chat.input.focus()  # the focus stays in the message box, as in the demo
        await settle(pilot)
        grid = main.engine_panel.query_one("#engine-grid")
        assert grid.max_scroll_y > 0
        await pilot.press("pagedown")
        await settle(pilot)
        assert grid.scroll_y > 0
        await pilot.press("pageup")
        await settle(pilot)
        assert grid.scroll_y == 0


# -- item 9: clutter and cut text --------------------------------------------------------------
def test_passing_k_and_g_says_the_pool_sentence_once() -> None:
    from engine.events import EmulationInfo, ModelCard

    card = ModelCard(
        name="m",
        path="m",
        dtype="bfloat16",
        num_layers=2,
        num_kv_heads=1,
        head_dim=64,
        kv_bytes_per_token=512,
        max_model_len=8192,
        block_size=16,
        total_blocks=64,
        device="cpu",
        emulation=EmulationInfo("L4", "qwen", 80_384, 512),
    )
    walls = walls_for(card, 20, 128)
    passed = [w for w in walls if w.passed_by(4096)]
    assert {w.kind for w in passed} == {"kv_pool", "gpu"}
    assert consequences(passed) == [
        "past the KV pool here and on a real L4: requests will be preempted/queued"
    ]


async def test_the_send_button_stays_on_screen_with_20_copies() -> None:
    app = make_app(FakeConfig(max_model_len=8192, total_blocks=1024))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        controls = app.main_screen.controls
        controls.concurrency = 20
        controls.synthetic = True
        await settle(pilot)
        button = controls.query_one("#send-synthetic")
        assert app.screen.region.contains_region(button.region)
        assert controls.region.contains_region(button.region)


# -- item 10: synthetic replies folded ---------------------------------------------------------
async def test_a_synthetic_reply_is_one_line_until_clicked() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.slider.value = 256
        main.controls.synthetic = True
        main.controls.query_one("#max-tokens", Input).value = "40"
        await pilot.pause()
        await main.send("", synthetic=True)
        await reply_done(pilot)
        reply = main.chat.replies()[-1]
        body = reply.query_one(".reply-markdown")
        noise = reply.query_one(".reply-noise")
        assert not body.display or body.region.height == 0
        assert str(noise.render()) == "⟨40 tokens of synthetic output, folded · click to show⟩"
        assert reply.footer_text.startswith("TTFT ")
        await pilot.click(".reply-noise")
        await settle(pilot)
        assert body.region.height > 0
        # Its tokens are still the measurement: the text is all there.
        assert len(reply.text.split()) == 40


# -- snapshots ---------------------------------------------------------------------------------
async def _preempted(pilot: Pilot[int]) -> None:
    await _four_copies(pilot)
    main = _app(pilot).main_screen
    if main.has_class("-narrow"):
        await pilot.press("f3")
    await settle(pilot)


@pytest.mark.parametrize(
    "size", [pytest.param(WIDE, id="160x48"), pytest.param(NARROW, id="80x24")]
)
def test_preemption_explained_snapshot(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(TINY_POOL), terminal_size=size, run_before=_preempted)


async def test_the_palette_offers_kvscopes_own_themes_only() -> None:
    from tui_helpers import WIDE, engine_ready, make_app

    from themes import all_themes

    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        ours = {t.name for t in all_themes()}
        assert set(app.available_themes) - {"textual-ansi"} == ours
        assert len(ours) == 3
