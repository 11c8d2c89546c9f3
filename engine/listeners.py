"""The listener registry the engines share: step samples, and a remote engine's scrapes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Generic, TypeVar

from engine.events import StepSample

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("kvscope")

T = TypeVar("T")


class Listeners(Generic[T]):
    def __init__(self) -> None:
        self._listeners: list[Callable[[T], None]] = []

    def add(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Register `listener`; returns a function that removes it again."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def __bool__(self) -> bool:
        """Whether anyone listens: an engine can skip building what nobody reads."""
        return bool(self._listeners)

    def emit(self, value: T) -> None:
        # A broken listener must not stop the engine that calls it.
        for listener in list(self._listeners):
            try:
                listener(value)
            except Exception:
                log.exception("kvscope: listener failed")


class StepListeners(Listeners[StepSample]):
    """Every StepSample an engine makes, to whoever listens (UI, bench, tapes)."""
