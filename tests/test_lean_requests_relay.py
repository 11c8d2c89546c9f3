"""The relay from the remote engine's IO thread to a consumer's loop (engine/remote/relay.py)
has no lock: every item put arrives, in order, with far fewer wake-ups than items, while
the interpreter switches threads as often as it can."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import pytest

from engine.remote.relay import Relay

QUEUES = 8
ITEMS = 20_000
# Items as the relay carries them (an error is one kind), numbered.
NUMBERED = [ValueError(i) for i in range(ITEMS)]


async def _relay_all(with_producer_loop: bool) -> tuple[list[list[Any]], int]:
    consumer = asyncio.get_running_loop()
    queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in range(QUEUES)]
    relay = Relay(consumer)
    producer = asyncio.new_event_loop() if with_producer_loop else None
    relay.producer = producer

    def produce() -> None:
        for i in range(ITEMS):
            relay.put(queues[i % QUEUES], NUMBERED[i])

    if producer is not None:
        thread = threading.Thread(target=producer.run_forever)
        thread.start()

        async def in_batches() -> None:
            for start in range(0, ITEMS, 97):  # many items a pass of the producer's loop
                for i in range(start, min(start + 97, ITEMS)):
                    relay.put(queues[i % QUEUES], NUMBERED[i])
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(in_batches(), producer)
    else:
        thread = threading.Thread(target=produce)
        thread.start()
    got: list[list[Any]] = [[] for _ in range(QUEUES)]
    for q, out in zip(queues, got, strict=True):
        for _ in range(ITEMS // QUEUES):
            out.append((await asyncio.wait_for(q.get(), timeout=20)).args[0])
    if producer is not None:
        producer.call_soon_threadsafe(producer.stop)
    thread.join(timeout=20)
    if producer is not None:
        producer.close()
    return got, relay.wakeups


@pytest.mark.parametrize("with_producer_loop", [False, True], ids=["any-thread", "io-loop"])
def test_every_item_arrives_in_order_with_few_wakeups(with_producer_loop: bool) -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        got, wakeups = asyncio.run(_relay_all(with_producer_loop))
    finally:
        sys.setswitchinterval(before)
    for k, items in enumerate(got):
        assert items == list(range(k, ITEMS, QUEUES))
    assert 0 < wakeups < ITEMS


class _PutsMeanwhile(asyncio.Queue[Any]):
    """A queue whose first item, as the relay hands it over, sees another put: as the IO
    thread would put the next token while the consumer drains."""

    relay: Relay | None = None

    def put_nowait(self, item: Any) -> None:
        super().put_nowait(item)
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.put(self, NUMBERED[1])


async def _put_during_drain() -> list[Any]:
    queue = _PutsMeanwhile()
    relay = Relay(asyncio.get_running_loop())
    queue.relay = relay
    relay.put(queue, NUMBERED[0])
    return [(await asyncio.wait_for(queue.get(), timeout=5)).args[0] for _ in range(2)]


def test_an_item_put_while_the_consumer_drains_is_not_left_behind() -> None:
    # No put comes after it: were the wake-up flag cleared only after the drain, this item
    # would wait for one, here for ever.
    assert asyncio.run(_put_during_drain()) == [0, 1]
