"""From the remote engine's IO thread to a consumer's event loop: many items a wake-up.

Each `call_soon_threadsafe` writes to the consumer loop's self-pipe and wakes it; one per
token is thousands of wake-ups a second at hundreds of streams, on a host the client
shares with everything else. A `Relay` wakes the consumer once for whatever arrived
before it ran: items are handed over in order, and each keeps the time its chunk
arrived, stamped on the IO thread before it gets here (never a batch's time).

With a `producer` loop (the IO thread's), the wake-up itself waits for the end of that
loop's pass: the tokens of every stream one `select` found ready go in one wake-up, where
the consumer, quick to drain, would otherwise be woken for nearly each token (the
self-pipe write was a third of the IO thread's CPU at 256 streams, benchmarks/load_truth.py).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from engine.request_book import Item


class Relay:
    """Hands (queue, item) pairs to `loop`; `put` from any thread, or only on `producer`'s
    thread when there is one."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, producer: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.loop = loop
        self.producer = producer
        """The loop `put` is called on, if always the same one; None: any thread."""
        # No lock: a deque's append and popleft are atomic, and the flag is cleared before
        # the items are taken, so an item put meanwhile is either taken now or schedules
        # a wake-up of its own. (A lock here was 7 % of the IO thread's CPU at 256
        # streams: the consumer, holding it, lost the GIL to the IO thread, which waited.)
        self._items: deque[tuple[asyncio.Queue[Item], Item]] = deque()
        self._scheduled = False
        self.wakeups = 0  # how many times the consumer was woken (a test reads it)

    def put(self, queue: asyncio.Queue[Item], item: Item) -> None:
        self._items.append((queue, item))
        if self._scheduled:
            return  # a wake-up is on its way and takes this one too
        self._scheduled = True
        if self.producer is not None:
            self.producer.call_soon(self._wake)  # after the rest of this pass's reads
        else:
            self._wake()

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the consumer's loop is gone: nobody is listening any more
            self._items.clear()
            self._scheduled = False

    def _drain(self) -> None:
        self._scheduled = False  # first: a put from now on wakes the consumer again
        self.wakeups += 1
        items = self._items
        for _ in range(len(items)):  # those here now; later ones have their own wake-up
            queue, item = items.popleft()
            queue.put_nowait(item)
