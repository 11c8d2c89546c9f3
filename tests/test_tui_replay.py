"""The replay screen: a real engine's tape (docs/tapes/kv-pool-preemption.jsonl) played
into the playground on virtual time, with pause, seek and the end of the tape.

Paused and on a VirtualClock, the replay moves only when a test moves it, so every
check (and both snapshots) sees one exact step of what the real engine did.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_tape import record_fake_session
from tui_helpers import NARROW, WIDE, make_app, notified, settle, wait_until

from engine.clock import VirtualClock
from engine.replay import ReplayEngine
from engine.tape import Tape, read_tape
from tui.app import KvscopeApp
from tui.screens.help import HelpScreen
from tui.screens.replay import ReplayScreen
from tui.sweep.screen import SweepScreen
from tui.widgets.engine_panel import HOST_CHECK_S
from tui.widgets.kv_block_map import USED

if TYPE_CHECKING:
    from textual.pilot import Pilot

POOL = Path(__file__).resolve().parents[1] / "docs" / "tapes" / "kv-pool-preemption.jsonl"
AT = 300
"""A step where 7 of the 8 copies hold 6 blocks each, 1 waits, and 1 was preempted."""


@pytest.fixture(scope="module")
def pool() -> Tape:
    return read_tape(POOL)


def replay_app(tape: Tape | Path) -> KvscopeApp:
    return make_app(engine=ReplayEngine(tape, clock=VirtualClock(), paused=True))


def screen(pilot: Pilot[int]) -> ReplayScreen:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    assert isinstance(main, ReplayScreen)
    return main


async def playing(pilot: Pilot[int]) -> ReplayScreen:
    """The app's replay, ready to move (its worker waits, paused, at step 0)."""
    main = screen(pilot)
    await wait_until(pilot, lambda: main.bar.position is not None, what="the replay to start")
    await settle(pilot, quiet=False)  # a replay on the real clock moves on its own
    return main


async def shown(pilot: Pilot[int]) -> None:
    """Wait until the screen took in everything the replay handed over, and drew it."""
    main = screen(pilot)
    seen: object = None
    still = 0
    for _ in range(400):
        await pilot.pause()
        replies = main.chat.replies()
        now = (
            [(r.title, [c.received for c in r.copies], r.done) for r in replies],
            main.telemetry.steps_version,
            main.bar.words,
        )
        still = still + 1 if now == seen else 0
        if still >= 3:
            break
        seen = now
    await settle(pilot)


def received_by(tape: Tape, request_id: str, position: int) -> int:
    """How many tokens of `request_id` the live screen had after the tape's n-th step."""
    step = tape.steps[position - 1].step
    request = next(r for r in tape.requests if r.request_id == request_id)
    return max((e.index + len(e.token_ids) for e in request.tokens if e.step <= step), default=0)


async def test_a_seek_shows_the_block_map_and_the_chat_of_that_step(pool: Tape) -> None:
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        assert main.bar.words == f"record 0 / {len(pool.steps)} · 1x · paused"
        assert main.chat.replies() == []
        main.replay.seek(AT)
        await shown(pilot)

        # The engine panel: the latest sample is the tape's step AT, and the block map
        # colours exactly the blocks each request held in it.
        sample = pool.steps[AT - 1]
        latest = app.telemetry.latest
        assert latest is not None and latest.step == sample.step == 820
        assert latest.blocks == sample.blocks
        block_map = main.engine_panel.block_map
        text = block_map.as_text()
        width = block_map.content_size.width
        held = {b: r.request_id for r in sample.blocks for b in r.block_ids}
        assert len(held) == 42 and block_map.free_blocks == sample.free_blocks == 2
        for block_id in range(sample.total_blocks):
            assert block_map.owner_of(block_id) == held.get(block_id)
            if block_id in held:
                assert text.plain[(block_id // width) * (width + 1) + block_id % width] == USED
        assert "step 820 · running 7 · waiting 1" in main.engine_panel.status_text()

        # The chat: the first reply finished with its footer, the 8 copies mid-stream.
        first, copies = main.chat.replies()
        assert first.title == "assistant · r1" and first.done
        assert first.footer_text.startswith("TTFT 46.0 ms")
        assert copies.title == "assistant · r2 · 512-token prompt × 8 copies"
        assert not copies.done
        assert [c.received for c in copies.copies] == [
            received_by(pool, rid, AT)
            for rid in [f"r2.{k}" if k > 1 else "r2" for k in range(1, 9)]
        ]
        assert copies.copies[0].received == 235
        assert "Tell me a long story." in main.chat.transcript_text()
        assert main.bar.words == f"record {AT} / {len(pool.steps)} · engine step 820 · 1x · paused"


async def test_keys_pause_step_rewind_and_reach_the_end(pool: Tape) -> None:
    app = replay_app(pool)
    length = len(pool.steps)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        replay = main.replay

        await pilot.press("right", "right")
        await shown(pilot)
        assert replay.position == 2 and main.bar.words.startswith(
            f"record 2 / {length} · engine step "
        )
        assert [r.title for r in main.chat.replies()] == ["assistant · r1"]

        replay.seek(AT)
        await shown(pilot)
        await pilot.press("left")  # back one step: the session plays again up to AT - 1
        await shown(pilot)
        assert replay.position == AT - 1
        replies = main.chat.replies()
        assert [r.title for r in replies] == [
            "assistant · r1",
            "assistant · r2 · 512-token prompt × 8 copies",
        ]
        assert replies[1].copies[0].received == received_by(pool, "r2", AT - 1)
        assert app.telemetry.latest is not None
        assert app.telemetry.latest.step == pool.steps[AT - 2].step

        await pilot.press("home")
        await shown(pilot)
        assert replay.position == 0 and main.chat.replies() == []
        assert app.telemetry.latest is None and app.telemetry.points == type(app.telemetry.points)()
        assert main.engine_panel.block_map.free_blocks == pool.steps[0].total_blocks

        main.action_seek_end()
        main.action_seek_start()  # before End's last records could play: it wins
        await shown(pilot)
        assert replay.position == 0 and replay.paused and replay.max_gap_s is None
        await pilot.press("end")
        await shown(pilot)
        assert replay.ended and main.bar.words.startswith(
            f"record {length} / {length} · engine step "
        )
        assert main.bar.words.endswith(" · 1x · end of tape")
        assert replay.paused and replay.max_gap_s is None  # as it was before End
        first, copies = main.chat.replies()
        assert first.done and copies.done
        assert copies.footer_text.startswith("TTFT 1,546 ms")
        assert len(app.telemetry.points) == 9  # a TTFT point per request, as live

        # Space at the end plays the tape again from its start (virtual time: at once).
        await pilot.press("space")
        await wait_until(
            pilot,
            lambda: replay.ended and not replay.paused,
            what="a replay",
            progress=lambda: replay.position,
        )
        await shown(pilot)
        assert len(main.chat.replies()) == 2 and main.chat.replies()[1].done

        # Back to step 10, still playing; Space pauses it there and it stays; Space again
        # plays on to the end.
        replay.seek(10)
        await pilot.press("space")
        assert replay.paused and not replay.ended
        where = replay.position
        await shown(pilot)
        assert replay.position == where and main.bar.words.endswith("· paused")
        await pilot.press("space")
        await wait_until(
            pilot,
            lambda: replay.ended,
            what="the end of the tape",
            progress=lambda: replay.position,
        )


async def test_a_rewind_before_the_screen_took_in_the_sends(pool: Tape) -> None:
    # Forward and back in one go: the sends of the first seek are still queued as
    # messages when the rewind comes, and must not take the replayed streams.
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        main.replay.seek(AT)
        main.replay.seek(AT - 1)
        await shown(pilot)
        first, copies = main.chat.replies()
        assert first.done and first.footer_text.startswith("TTFT 46.0 ms")
        assert [c.error for c in copies.copies] == [None] * 8
        assert copies.copies[0].received == received_by(pool, "r2", AT - 1)


async def test_it_plays_on_the_real_clock_at_a_speed_and_quits(pool: Tape) -> None:
    # 86 s of tape at 10x: about 9 s to the end, with every step on time; slow enough that
    # a busy host cannot reach the end before the pause key lands.
    app = make_app(engine=ReplayEngine(pool, speed=10.0))
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        replay = main.replay
        await wait_until(pilot, lambda: replay.position >= 100, what="100 steps")
        await pilot.press("space")
        # On a busy host the bar may take a tick to say so: wait for it, then hold still.
        await wait_until(
            pilot, lambda: main.bar.words.endswith(" · 10x · paused"), timeout=10, what="paused"
        )
        where = replay.position
        await pilot.pause(0.2)
        assert replay.position == where
        await pilot.press("space")
        await wait_until(
            pilot, lambda: replay.ended, what="the end", progress=lambda: replay.position
        )
        await shown(pilot)
        assert all(r.done for r in main.chat.replies())
        await pilot.press("ctrl+q")  # the replay's shutdown is quick; the app exits
        await wait_until(pilot, lambda: not app.is_running, timeout=20, what="the app to exit")


async def test_nothing_can_be_sent_from_a_replay(pool: Tape) -> None:
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        assert main.chat.input.disabled and not main.chat.input.display
        note = main.query_one("#replay-note")
        assert "Replay of kv-pool-preemption.jsonl" in str(note.render())
        assert not await main.send("hello")
        await notified(pilot, "A replay cannot send a message")
        await pilot.press("f5")  # the sweep needs an engine: refused, in words
        await notified(pilot, "cannot run a sweep")
        assert not isinstance(app.screen, SweepScreen)
        await pilot.press("ctrl+n")  # the tape decides when a chat starts
        assert main.replay.position == 0
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = dict(app.screen.key_sections())["Replay (kvscope replay TAPE)"]
        assert keys == [
            ("space", "Play/pause"),
            ("left", "Step back"),
            ("right", "Step on"),
            ("home", "To the start"),
            ("end", "To the end"),
        ]


@pytest.fixture(scope="module")
def cut_tape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FakeEngine session's tape, cut mid-reply as a kill -9 would cut it."""
    folder = tmp_path_factory.mktemp("cut")
    session = folder / "session.jsonl"
    record_fake_session(session)
    data = session.read_bytes()
    at = 0
    for _ in range(40):  # just before the 40th token of a copy
        at = data.index(b'\n["t","r2.2"', at + 1)
    cut = folder / "cut.jsonl"
    cut.write_bytes(data[: at + 1])
    return cut


async def test_a_tape_cut_mid_reply_ends_marked_interrupted(cut_tape: Path) -> None:
    app = replay_app(cut_tape)  # a path: the screen's start-up reads it
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        await pilot.press("end")
        await shown(pilot)
        first, copies = main.chat.replies()
        assert first.done and first.footer_text.startswith("TTFT")
        assert copies.done and copies.text  # the partial reply is kept
        assert copies.footer_text.startswith("✗ Interrupted: the recording stops here")
        assert "after 40 tokens" in copies.footer_text


# -- snapshots ------------------------------------------------------------------------------


async def _at_step(pilot: Pilot[int]) -> None:
    main = await playing(pilot)
    main.replay.seek(AT)
    await shown(pilot)
    if main.has_class("-narrow"):
        await pilot.press("f3")  # at 80x24: the Engine tab, where the block map moves
    # The engine panel reads the host's state once a second: once more, on these steps.
    await asyncio.sleep(HOST_CHECK_S)
    await shown(pilot)


SIZES = [pytest.param(NARROW, id="80x24"), pytest.param(WIDE, id="160x48")]


@pytest.mark.parametrize("size", SIZES)
def test_replay_screen_at_a_step(snap_compare, size: tuple[int, int], pool: Tape) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(replay_app(pool), terminal_size=size, run_before=_at_step)
