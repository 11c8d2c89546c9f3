"""The step-listener registry both engines share."""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.events import StepListener, StepSample

log = logging.getLogger("kvscope")


class StepListeners:
    def __init__(self) -> None:
        self._listeners: list[StepListener] = []

    def add(self, listener: StepListener) -> Callable[[], None]:
        """Register `listener`; returns a function that removes it again."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def emit(self, sample: StepSample) -> None:
        # A broken listener must not stop the engine that calls it.
        for listener in list(self._listeners):
            try:
                listener(sample)
            except Exception:
                log.exception("kvscope: step listener failed")
