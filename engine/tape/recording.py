"""RecordingEngine: any Engine, recorded to a tape as it runs, by delegation."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.delegating import DelegatingEngine
from engine.events import (
    EngineEvent,
    GenerationRequest,
    ModelCard,
    ProgressCallback,
    RequestFinished,
    UserMessage,
)
from engine.tape.recorder import DEFAULT_CAP_BYTES, NoticeCallback, TapeRecorder

if TYPE_CHECKING:
    import os
    from collections.abc import AsyncIterator, Callable

    from engine.features import EngineFeatures
    from engine.protocol import Engine


def record(
    inner: Engine,
    path: str | os.PathLike[str] | None = None,
    *,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    on_notice: NoticeCallback | None = None,
) -> RecordingEngine:
    """`inner`, recorded to `path` (None: a new tape in the user's data folder), on the
    clock `inner` stamps its events with. Raises TapeUnwritable."""
    recorder = TapeRecorder(
        path, cap_bytes=cap_bytes, clock=inner.features.clock, on_notice=on_notice
    )
    return RecordingEngine(inner, recorder)


class RecordingEngine(DelegatingEngine):
    """The Engine protocol on top of `inner`, with everything that crosses it taped.

    It records the model card when the engine starts, every StepSample (through a step
    listener of its own), every event of every `stream()` (accepted, tokens, finished),
    a stream that raised (with the error's words), and what `record_user_message` is told.

    `recorder` should run on the inner engine's clock: `TapeRecorder(path,
    clock=inner.features.clock)`, or the default real clock for VllmEngine.
    """

    def __init__(self, inner: Engine, recorder: TapeRecorder) -> None:
        super().__init__(inner)
        self.recorder = recorder
        self._remove_listener: Callable[[], None] | None = inner.add_step_listener(
            recorder.record_step
        )
        self._card: ModelCard | None = None
        if inner.card is not None:
            self._record_card(inner.card)

    def _record_card(self, card: ModelCard) -> None:
        # start() on an engine that already runs returns the same card: one record.
        if card is not self._card:
            self._card = card
            self.recorder.record_card(card)

    # -- the protocol ------------------------------------------------------------------------
    @property
    def features(self) -> EngineFeatures:
        return self.inner.features.with_tape(self)

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        card = self.inner.start(progress)
        self._record_card(card)
        return card

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        recorder = self.recorder
        recorder.record_request(request)
        finished = False
        try:
            async for event in self.inner.stream(request):
                recorder.record_event(event)
                if isinstance(event, RequestFinished):
                    finished = True
                yield event
        except (Exception, asyncio.CancelledError) as exc:
            if not finished:
                if isinstance(exc, asyncio.CancelledError):
                    recorder.record_abandoned(request.request_id)
                else:
                    recorder.record_failure(request.request_id, exc)
            raise
        except GeneratorExit:
            # The consumer closed the stream early (it broke out of its loop).
            if not finished:
                recorder.record_abandoned(request.request_id)
            raise

    def shutdown(self) -> None:
        """Shut the inner engine down (its last events are taped), then close the tape."""
        try:
            self.inner.shutdown()
        finally:
            self.close_tape()

    # -- beyond the protocol -----------------------------------------------------------------
    def record_user_message(
        self,
        text: str,
        *,
        request_ids: tuple[str, ...] | list[str] = (),
        synthetic_tokens: int | None = None,
    ) -> UserMessage:
        """Tape what the user sent; call it before streaming the requests it starts."""
        return self.recorder.record_user_message(
            text, request_ids=request_ids, synthetic_tokens=synthetic_tokens
        )

    def record_new_chat(self) -> None:
        self.recorder.record_new_chat()

    def close_tape(self) -> None:
        """Stop recording and close the tape, leaving the inner engine running."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        self.recorder.close()
