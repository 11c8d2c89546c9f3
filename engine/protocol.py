"""The one interface between kvscope's engines and everything that uses them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

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


@runtime_checkable
class Engine(Protocol):
    """An inference engine kvscope can drive.

    `start` blocks (call it from a thread worker); `stream` is an async iterator that works
    from any event loop; step listeners are called from the engine's own thread, so a UI
    must only `post_message` from them.
    """

    @property
    def card(self) -> ModelCard | None: ...

    @property
    def features(self) -> EngineFeatures:
        """What this engine offers beyond this protocol (see engine/features.py)."""
        ...

    def start(self, progress: ProgressCallback | None = None) -> ModelCard: ...

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """Call `listener` with every StepSample; returns a function that removes it."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """Submit `request` and yield its events, ending with RequestFinished.

        Raises a KvscopeError (PromptTooLong, EngineDied, ...) instead of finishing.
        """
        ...

    def abort(self, request_id: str) -> None: ...

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """The exact token IDs the model's chat template makes of `messages`."""
        ...

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        """A chat prompt of exactly `num_tokens` tokens: filler words, then `suffix`."""
        ...

    def shutdown(self) -> None: ...
