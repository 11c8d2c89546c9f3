"""The in-process engine's life cycle without a model: what happens around shutdown()."""

from __future__ import annotations

import pytest

from engine.errors import EngineDied
from engine.vllm.engine import VllmEngine


def test_a_start_after_shutdown_refuses_without_building() -> None:
    # The app quit before its worker got round to start(): nothing may load after that.
    engine = VllmEngine(argv=["--model", "/no/such/model"])
    engine.shutdown()
    with pytest.raises(EngineDied, match="shut down"):
        engine.start()
    assert engine._thread is None


def test_shutdown_twice_is_harmless() -> None:
    engine = VllmEngine(argv=[])
    engine.shutdown()
    engine.shutdown()
