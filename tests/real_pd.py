"""A real prefill/decode pair on loopback: two small CPU vLLM servers whose KV moves from
one to the other through vLLM's ExampleConnector (a shared folder).

Each is tests/real_fleet.py's FleetServer (the embedded model, a small pool, prefix caching,
per-request metrics, no API key, one OpenMP thread on its own core) with
`--kv-transfer-config`: the prefill server as `kv_producer`, writing each prompt's KV
blocks to `store`, the decode server as `kv_consumer`, loading them from there. Both start
at once, each bounded by real_fleet's START_TIMEOUT_S; both are killed at the end.
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from real_fleet import START_TIMEOUT_S, FleetServer

if TYPE_CHECKING:
    from collections.abc import Iterator


class PdServer(FleetServer):
    """A FleetServer with vLLM's ExampleConnector in `role`, its KV folder `store`."""

    def __init__(self, core: int, role: str, store: Path) -> None:
        super().__init__(core)
        self.role = role
        self.store = store

    @property
    def argv(self) -> list[str]:
        config = {
            "kv_connector": "ExampleConnector",
            "kv_role": self.role,
            "kv_connector_extra_config": {"shared_storage_path": str(self.store)},
        }
        return [*super().argv, "--kv-transfer-config", json.dumps(config)]


@dataclass
class RealPair:
    prefill: PdServer
    decode: PdServer
    store: Path
    start_seconds: float

    def stored_files(self) -> list[Path]:
        return [p for p in self.store.rglob("*") if p.is_file()]


@contextmanager
def running_pair() -> Iterator[RealPair]:
    """The prefill server on core 0, the decode server on core 1, sharing one folder."""
    with tempfile.TemporaryDirectory(prefix="kvscope-pd-") as folder:
        store = Path(folder)
        prefill = PdServer(0, "kv_producer", store)
        decode = PdServer(1, "kv_consumer", store)
        began = time.perf_counter()
        try:
            prefill.launch()
            decode.launch()
            deadline = began + START_TIMEOUT_S
            prefill.wait_healthy(deadline)
            decode.wait_healthy(deadline)
            yield RealPair(prefill, decode, store, time.perf_counter() - began)
        finally:
            prefill.stop()
            decode.stop()
            alive = [s.role for s in (prefill, decode) if s.group_alive()]
            assert not alive, f"vLLM server processes of {alive} outlived the tests"
