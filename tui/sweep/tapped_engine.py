"""TappedEngine: an engine that reports every finished request the moment it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.delegating import DelegatingEngine
from engine.events import RequestFinished

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from engine.events import EngineEvent, GenerationRequest
    from engine.protocol import Engine


class TappedEngine(DelegatingEngine):
    """The engine as run_sweep sees it, with every finished request reported as it ends.

    run_sweep reports a length only when all its runs are done; a sweep of long prompts
    would show nothing for minutes. This reports each request the moment it finishes.
    """

    def __init__(self, inner: Engine, on_finished: Callable[[RequestFinished], None]) -> None:
        super().__init__(inner)
        self._on_finished = on_finished

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        async for event in self.inner.stream(request):
            if isinstance(event, RequestFinished):
                self._on_finished(event)
            yield event
