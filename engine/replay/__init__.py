"""Replaying a session tape through the Engine protocol, with no vLLM and no torch."""

from __future__ import annotations

from engine.replay.engine import (
    PositionListener,
    ReplayedSend,
    ReplayEngine,
    ReplayPosition,
    SendListener,
)

__all__ = ["PositionListener", "ReplayEngine", "ReplayPosition", "ReplayedSend", "SendListener"]
