"""SVG snapshots of prefix-cache reuse (issue 23, item 6) on the FakeEngine's prefix cache.

Three chat turns that open with the same question: the second turn's footer says how many
prompt tokens came from the cache, and the third, held mid-reply (HoldingClock), sits on
the question's blocks drawn as reused, beside the blocks the earlier turns left cached.
Update with `pytest tests/test_block_map_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Input
from tui_helpers import (
    NARROW,
    WIDE,
    HoldingClock,
    engine_ready,
    make_app,
    reply_done,
    send_chat,
    settle,
    wait_until,
)

from engine.fake import FakeConfig
from tui.app import KvscopeApp

if TYPE_CHECKING:
    from textual.pilot import Pilot

CACHING = FakeConfig(prefix_caching=True)
# Thirty-odd words: two full 16-token blocks that every later turn opens with.
QUESTION = (
    "Before we start, here is the setting: a small model, a small pool, one user typing "
    "questions one after the other. With that in mind, what does the KV cache hold?"
)


async def _two_turns(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    # Short replies, so that every turn and its footer fit on one screen.
    main.controls.query_one("#max-tokens", Input).value = "12"
    await send_chat(pilot, QUESTION)
    await reply_done(pilot)
    await send_chat(pilot, "And what does it keep after a reply?")
    await reply_done(pilot)


def _third_turn_held(clock: HoldingClock, tab: str | None = None) -> object:
    async def before(pilot: Pilot[int]) -> None:
        await _two_turns(pilot)
        app = pilot.app
        assert isinstance(app, KvscopeApp)
        main = app.main_screen
        clock.hold_after = clock.steps + 4  # its prefill and three tokens, then hold
        await send_chat(pilot, "So a third question starts where?")
        await wait_until(
            pilot,
            lambda: (
                main.current is not None and main.current.copies[0].received >= 3 and clock.holding
            ),
        )
        if tab is not None:
            await pilot.press(tab)
        await settle(pilot)

    return before


def test_second_turn_lands_on_cached_blocks_160x48(snap_compare) -> None:  # type: ignore[no-untyped-def]
    clock = HoldingClock()
    app = make_app(CACHING, clock=clock)
    try:
        assert snap_compare(app, terminal_size=WIDE, run_before=_third_turn_held(clock))
    finally:
        clock.release()


def test_second_turn_lands_on_cached_blocks_80x24_engine(snap_compare) -> None:  # type: ignore[no-untyped-def]
    clock = HoldingClock()
    app = make_app(CACHING, clock=clock)
    try:
        assert snap_compare(app, terminal_size=NARROW, run_before=_third_turn_held(clock, "f3"))
    finally:
        clock.release()


def test_second_turn_cached_tokens_in_the_footer_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(CACHING), terminal_size=NARROW, run_before=_two_turns)
