"""A step that runs for seconds reads as running, not as idle (issue #23, item 2).

The FakeEngine announces no steps (it makes each step at once); the real engine's
announcements are checked in tests/test_step_starts.py. Here the screen is handed one, as
the step thread would hand it, with a clock the test sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from tui_helpers import WIDE, HoldingClock, engine_ready, make_app, settle, wait_until

from engine.events import PrefillChunk, RequestBlocks, StepStarted
from engine.fake import FakeConfig
from tui.messages import StepBegan

if TYPE_CHECKING:
    from collections.abc import Callable

    from tui.app import KvscopeApp

CONFIG = FakeConfig(max_model_len=4096, total_blocks=256, max_num_batched_tokens=1024)


async def _running_prefill(app: KvscopeApp, pilot: object) -> tuple[str, StepStarted]:
    from textual.pilot import Pilot

    assert isinstance(pilot, Pilot)
    main = app.main_screen
    await engine_ready(pilot)
    main.controls.slider.value = 2048
    main.controls.synthetic = True
    await pilot.pause()
    await main.send("", synthetic=True)
    tel = main.telemetry
    await wait_until(pilot, lambda: bool(tel.requests.tracks) and tel.latest is not None)
    (rid,) = tel.requests.tracks
    latest = tel.latest
    assert latest is not None
    # Step 2 takes the prompt's second chunk and has run 12 s when the screen looks.
    started = StepStarted(
        step=latest.step + 1,
        started_at=100.0,
        prefill_tokens=1024,
        decode_tokens=0,
        chunks=(PrefillChunk(rid, 1024, 2, 2, 2048),),
        decoding=0,
        blocks=(RequestBlocks(rid, tuple(range(128)), 2048),),
        free_blocks=128,
        total_blocks=256,
    )
    tel.requests.now = lambda: 112.0
    main.post_message(StepBegan(started))
    await pilot.pause()
    await settle(pilot)
    return rid, started


async def test_a_long_prefill_step_shows_as_running_with_its_chunk_and_clock() -> None:
    clock = HoldingClock(hold_after=1)  # step 1 (chunk 1) ran; the fake waits after it
    app = make_app(CONFIG, clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        rid, started = await _running_prefill(app, pilot)
        main = app.main_screen
        line = main.engine_panel.status_text()
        assert line.startswith(f"step {started.step:,} running: prefill 1,024 tok of {rid}")
        assert "(chunk 2 of 2) · 12 s so far" in line
        assert "idle" not in line
        where = main.telemetry.status(rid, accepted=True)
        assert (where.phase, where.words) == ("prefilling", "prefilling (chunk 2 of 2), 12 s")
        # The block map draws what the step was given, before the model has run.
        block_map = main.engine_panel.block_map
        assert block_map.free_blocks == 128
        # The clock ticks while the step runs.
        main.telemetry.requests.now = lambda: 113.0
        await settle(pilot)
        assert "13 s so far" in main.engine_panel.status_text()
        # Its sample ends the running state.
        clock.release()
        await wait_until(
            pilot,
            lambda: main.telemetry.running is None,
            what="the step's sample to end the running state",
        )
        await settle(pilot)
        assert "running:" not in main.engine_panel.status_text()


@pytest.mark.parametrize("size", [WIDE], ids=["160x48"])
def test_snapshot_of_a_running_prefill(
    snap_compare: Callable[..., bool], size: tuple[int, int]
) -> None:
    clock = HoldingClock(hold_after=1)
    app = make_app(CONFIG, clock=clock)

    async def before(pilot: object) -> None:
        await _running_prefill(app, pilot)

    assert snap_compare(app, run_before=before, terminal_size=size)
