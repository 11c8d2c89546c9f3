"""DelegatingEngine: the Engine protocol forwarded to an inner engine, for engines that wrap
engines (a tape recorder, the sweep screen's tap). A subclass overrides what it changes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from engine.events import (
        ChatMessage,
        EngineEvent,
        GenerationRequest,
        ModelCard,
        ProgressCallback,
        StepListener,
    )
    from engine.features import EngineFeatures
    from engine.protocol import Engine


class DelegatingEngine:
    """Every protocol member, forwarded to `inner`; `features` included, so a wrapper keeps
    what its engine offers (a recorded --url session keeps its remote view)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    @property
    def card(self) -> ModelCard | None:
        return self.inner.card

    @property
    def features(self) -> EngineFeatures:
        return self.inner.features

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        return self.inner.start(progress)

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self.inner.add_step_listener(listener)

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        return self.inner.stream(request)

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        return self.inner.chat_prompt_ids(messages)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        return self.inner.synthetic_prompt(num_tokens, suffix, seed)

    def shutdown(self) -> None:
        self.inner.shutdown()


if TYPE_CHECKING:  # mypy checks that the base keeps to the Engine protocol
    from engine.fake import FakeEngine

    _conforms: Engine = DelegatingEngine(FakeEngine())
