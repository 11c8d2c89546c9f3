"""Clocks the engines run on: the real one, and a virtual one for deterministic tests."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class VirtualClock:
    """Time that moves only when the engine says a step took so long.

    Sleeping still yields to the event loop once, so consumers run between steps exactly
    as they would with real time, but no test ever waits and no value depends on the
    machine's speed.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    async def sleep(self, seconds: float) -> None:
        self._t += max(0.0, seconds)
        await asyncio.sleep(0)
