"""The stream watchdog (engine/remote/timeouts.py): a limit moved on every chunk only
writes the new deadline, and the timer set for an older one sets itself again. These
check that it still fires at the latest deadline, never before it, and at an earlier one
when the limit is brought forward."""

from __future__ import annotations

import asyncio
import time

from engine.remote.timeouts import Watchdog


async def _held_for(watchdog_s: float, moves: int, every_s: float) -> tuple[float, float]:
    """Move the limit `moves` times, `every_s` apart, then wait for it: the seconds from
    the last move to the TimeoutError, and how long the moves took."""
    began = moved = time.monotonic()
    try:
        async with Watchdog(watchdog_s) as timer:
            for _ in range(moves):
                await asyncio.sleep(every_s)
                timer.reschedule(watchdog_s)
            moved = time.monotonic()
            await asyncio.sleep(3600)
    except TimeoutError:
        return time.monotonic() - moved, moved - began
    raise AssertionError("the block ended with no TimeoutError")


def test_a_limit_moved_on_every_chunk_fires_only_after_the_last_move() -> None:
    # Moves every 0.05 s for 2 s: the first deadline (1 s) is long past when the block
    # ends, and only the last one counts.
    after_last, moving = asyncio.run(_held_for(1.0, 40, 0.05))
    assert moving >= 2.0 > 1.0  # every move came before its own limit ran out
    assert after_last >= 1.0  # never before the latest deadline (a floor on any machine)


def test_a_limit_brought_forward_fires_at_the_earlier_deadline() -> None:
    async def run() -> float:
        began = time.monotonic()
        try:
            async with Watchdog(3600) as timer:
                timer.reschedule(0.05)
                await asyncio.sleep(3600)
        except TimeoutError:
            return time.monotonic() - began
        raise AssertionError("the block ended with no TimeoutError")

    # Well under the hour it was first given: the timer for it was replaced.
    assert 0.05 <= asyncio.run(run()) < 600


def test_a_block_that_ends_in_time_is_not_cancelled() -> None:
    async def run() -> str:
        async with Watchdog(0.1) as timer:
            for _ in range(5):
                await asyncio.sleep(0.02)
                timer.reschedule(0.1)
        await asyncio.sleep(0.3)  # past every deadline it had: nothing fires afterwards
        return "done"

    assert asyncio.run(run()) == "done"
