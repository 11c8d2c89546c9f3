"""Shared fixtures. The real engine starts once per test session (about 15 s on 2 cores)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

# Small enough to start fast and to fill; large enough for one 4,096-token request.
ENGINE_ARGV = ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(128 * 1024**2)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that uses the session engine runs vLLM; `make test-fast` skips them.
    for item in items:
        if "vllm_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[object]:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    engine = VllmEngine(argv=ENGINE_ARGV)
    engine.start()
    yield engine
    engine.shutdown()
