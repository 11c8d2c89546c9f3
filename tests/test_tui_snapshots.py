"""SVG snapshots of kvscope at 80x24 (tabs) and 160x48 (three columns).

Deterministic by construction: the FakeEngine runs on virtual time (HoldingClock stops it
at an exact step when a snapshot needs requests in flight), nothing on screen comes from
the wall clock, the cursor does not blink and animations are off.
Update with `pytest tests/test_tui_snapshots.py --snapshot-update`, then look at the SVGs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from tui_helpers import (
    NARROW,
    SERIES_CONFIG,
    WIDE,
    HoldingClock,
    engine_ready,
    make_app,
    reply_done,
    send_chat,
    send_series,
    settle,
    wait_until,
)

from engine.fake import FakeConfig
from tui.app import KvscopeApp
from tui.widgets.plot import Plot

SWEEP_COMPARE = Path(__file__).parent / "fixtures" / "sweep" / "compare.json"
SIZES = [pytest.param(NARROW, id="80x24"), pytest.param(WIDE, id="160x48")]
Before = Callable[[Pilot[int]], Awaitable[None]]


def _main(pilot: Pilot[int]) -> KvscopeApp:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    return app


async def _ready(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)


async def _finished_reply(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)
    await send_chat(pilot, "What does the KV cache hold?")
    await reply_done(pilot)


async def _slider_past_wall(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)
    main = _main(pilot).main_screen
    await pilot.press("f4")
    await pilot.press("end", "left", "left")  # 2,528 tokens: past max_model_len (2,048)
    await main.send("", synthetic=True)
    await reply_done(pilot)
    main.controls.slider.focus()
    main.controls.scroll_to_widget(main.controls.query_one("#prompt-box"), top=True, animate=False)
    await settle(pilot)


def _two_requests(clock: HoldingClock) -> Before:
    async def before(pilot: Pilot[int]) -> None:
        await engine_ready(pilot)
        main = _main(pilot).main_screen
        main.controls.concurrency = 2
        main.controls.slider.value = 320
        main.controls.synthetic = True
        await pilot.pause()
        await main.send("Two copies at once.", synthetic=True)
        await wait_until(
            pilot,
            lambda: main.current is not None and all(c.received == 5 for c in main.current.copies),
        )
        if main.has_class("-narrow"):
            await pilot.press("f3")
        await settle(pilot)

    return before


async def _after_the_series(pilot: Pilot[int]) -> None:
    """A chat turn, then synthetic prompts of 512 to 4,096 tokens sent with Enter."""
    await engine_ready(pilot)
    await send_chat(pilot, "What does the KV cache hold?")
    await reply_done(pilot)
    await send_series(pilot)
    main = _main(pilot).main_screen
    if main.has_class("-narrow"):
        # The Engine tab scrolls at 80x24: show the latency plot, the one that matters here.
        await pilot.press("f3")
        await settle(pilot)
        box = main.engine_panel.query_one("#ttft-box")
        main.engine_panel.query_one("#engine-grid").scroll_to_widget(box, animate=False, top=True)
    await settle(pilot)


async def _sweep_with_a_compare_file(pilot: Pilot[int]) -> None:
    """The sweep screen before any run, with a `bench --compare` file loaded (F9)."""
    from textual.widgets import Input

    from tui.sweep.screen import SweepScreen

    await engine_ready(pilot)
    await pilot.press("f5")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, SweepScreen)
    # Relative to the test's working folder: no machine's own path in the SVG.
    screen.query_one("#load-path", Input).value = SWEEP_COMPARE.name
    await pilot.press("f9")
    await wait_until(pilot, lambda: screen.overlay is not None)
    await wait_until(pilot, lambda: screen.query_one("#sweep-itl", Plot).has_drawing)
    await settle(pilot)


async def _help(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)
    await pilot.press("f1")
    await settle(pilot)


@pytest.mark.parametrize("size", SIZES)
def test_empty_app(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(), terminal_size=size, run_before=_ready)


@pytest.mark.parametrize("size", SIZES)
def test_finished_reply_with_footer(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(), terminal_size=size, run_before=_finished_reply)


@pytest.mark.parametrize("size", SIZES)
def test_slider_past_a_wall(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(), terminal_size=size, run_before=_slider_past_wall)


@pytest.mark.parametrize("size", SIZES)
def test_block_map_with_two_requests(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    clock = HoldingClock(hold_after=5)
    app = make_app(FakeConfig(), clock=clock)
    try:
        assert snap_compare(app, terminal_size=size, run_before=_two_requests(clock))
    finally:
        clock.release()


@pytest.mark.parametrize("size", SIZES)
def test_latency_plot_after_the_512_to_4096_series(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    # Both series on one plot (TTFT rises, median ITL stays flat), round ticks, a key.
    assert snap_compare(make_app(SERIES_CONFIG), terminal_size=size, run_before=_after_the_series)


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(), terminal_size=size, run_before=_help)


def test_sweep_screen_with_a_saved_compare_file(snap_compare, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Both configs' points in both charts (◆ A, ◇ B), their legend, and the keys.
    monkeypatch.chdir(SWEEP_COMPARE.parent)
    assert snap_compare(make_app(), terminal_size=(160, 48), run_before=_sweep_with_a_compare_file)
