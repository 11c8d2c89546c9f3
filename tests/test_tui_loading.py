"""The loading banner while an engine starts (issue 23, item 9): the bar never sits still
through a long stage, and at 80x24 the narrow layout holds the whole of its words.

The engine here is a FakeEngine whose start() reports a stage and then waits, as vLLM's
import does for most of a CPU start; the banner's clock is held, so its seconds are exact.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from held_clock import HeldClock
from textual.widgets import ProgressBar
from tui_helpers import NARROW, make_app, wait_until

from engine.events import LoadProgress
from engine.fake import FakeEngine
from tui.app import KvscopeApp
from tui.widgets.engine_status import PULSE_AFTER_S, EngineStatus

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from engine.events import ModelCard, ProgressCallback

STAGE = LoadProgress("importing vLLM", 0.05)


class GatedEngine(FakeEngine):
    """Reports `STAGE`, then starts only once `gate` is set (or after a minute)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        if progress:
            progress(STAGE)
        self.gate.wait(60)
        return super().start(None)


async def _loading(pilot: Pilot[int], clock: HeldClock) -> EngineStatus:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    await wait_until(pilot, lambda: bool(main.query(EngineStatus)), what="the banner")
    status = main.chat.status
    status.clock = clock
    await wait_until(pilot, lambda: status.progress == STAGE, what="the stage to show")
    status.watch_progress()  # the stage starts now on the held clock
    await pilot.pause()
    return status


def _bar(status: EngineStatus) -> ProgressBar:
    return status.query_one("#engine-status-bar", ProgressBar)


async def test_a_long_stage_pulses_the_bar_and_counts_its_seconds() -> None:
    engine = GatedEngine()
    app = make_app(engine=engine)
    clock = HeldClock(100.0)
    try:
        async with app.run_test(size=NARROW) as pilot:
            status = await _loading(pilot, clock)
            bar = _bar(status)
            # Just reported: the bar is at the stage's share.
            assert bar.total == 1.0 and bar.percentage == STAGE.fraction
            clock.now += PULSE_AFTER_S + 11
            status._tick()  # the banner's own once-a-second tick
            await pilot.pause()
            assert bar.total is None  # pulsing: no bar held at 5 % for the whole stage
            words = status.loading_words()
            assert words.startswith("Engine loading (5%): importing vLLM… 12 s")
            # A new stage: its share shows at once, its seconds count from zero.
            status.progress = LoadProgress("loading weights", 0.3)
            await pilot.pause()
            assert bar.total == 1.0 and bar.percentage == 0.3
            assert "loading weights…\n" in status.loading_words()
            status.progress = LoadProgress("ready", 1.0)
            assert status.loading_words() == "Engine loaded: the panels fill in now."
            engine.gate.set()
    finally:
        engine.gate.set()


async def test_the_80x24_loading_screen_is_narrow_and_cuts_no_word() -> None:
    engine = GatedEngine()
    app = make_app(engine=engine)
    try:
        async with app.run_test(size=NARROW) as pilot:
            status = await _loading(pilot, HeldClock(100.0))
            assert app.main_screen.has_class("-narrow")
            width = status.query_one("#engine-status-text").content_size.width
            assert width > 0
            for line in status.loading_words().splitlines():
                assert len(line) <= width, (line, width)
            engine.gate.set()
    finally:
        engine.gate.set()


def test_loading_screen_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    engine = GatedEngine()
    clock = HeldClock(100.0)

    async def twelve_seconds_in(pilot: Pilot[int]) -> None:
        status = await _loading(pilot, clock)
        clock.now += 12
        status._tick()
        await pilot.pause()
        # The app's exit waits for start() to return: let it, well after the screenshot
        # (taken as soon as this returns), instead of after start()'s own minute.
        threading.Timer(5.0, engine.gate.set).start()

    try:
        assert snap_compare(
            make_app(engine=engine), terminal_size=NARROW, run_before=twelve_seconds_in
        )
    finally:
        engine.gate.set()
