"""Hands a request's events from its queue to the consumer, for both engines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.events import EngineEvent, RequestFinished

if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator


async def relay(queue: asyncio.Queue[EngineEvent | BaseException]) -> AsyncIterator[EngineEvent]:
    """Yield events until RequestFinished; an exception put on the queue is raised here."""
    while True:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, RequestFinished):
            return
