"""Messages that carry engine news into the app.

They are posted from the engine's threads (start-up worker, step thread), which is why
they exist at all: from another thread a widget may only be told things by message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from engine.errors import KvscopeError
    from engine.events import LoadProgress, ModelCard, ScrapeSample, StepSample, StepStarted


@dataclass
class EngineProgressed(Message):
    """A start-up stage was reached."""

    progress: LoadProgress


@dataclass
class EngineReady(Message):
    """`engine.start()` returned; the card describes what was loaded."""

    card: ModelCard


@dataclass
class EngineFailed(Message):
    """Start-up failed; `error.plain()` says why in the user's words."""

    error: KvscopeError


@dataclass
class StepSampled(Message):
    """One engine step's sample, from the step listener."""

    sample: StepSample


@dataclass
class StepBegan(Message):
    """A step the engine is running now (its StepSampled follows when it ends)."""

    started: StepStarted


@dataclass
class ScrapeSampled(Message):
    """A remote server's /metrics scrape, from the remote engine's scraper thread."""

    sample: ScrapeSample
