"""What each test asked of vLLM: its prefill and decode seconds, for the slow-CPU estimate.

A prefill is about 14 times slower on an AVX2-only CPU than on one with AVX-512 bf16 units,
a decode step about 1.6 times (issue #28, measured on two 2-core EPYCs), so a test's time
on the slow CPU is about its time here plus 13 x its prefill seconds plus 0.6 x its decode
seconds. `.ci/run` writes each test's figures into its timeline line (tests/conftest.py)
and scripts/test_timeline.py sums them per worker.

Counted: every VllmEngine started in the test process (its steps' time, split between
prefill and decode by the tokens each step ran) and every server a test fixture started (its own
`vllm:request_prefill_time_seconds` and `..._decode_...` sums, read before and after each
test that uses one). Not counted: vLLM started by a test's own subprocess (`kvscope
generate` run as a user would), which the timeline marks instead.
"""

from __future__ import annotations

import sys
import threading
import urllib.request
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from engine.events import StepSample

PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
DECODE_SUM = "vllm:request_decode_time_seconds_sum"
SCRAPE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Work:
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0

    def __sub__(self, other: Work) -> Work:
        return Work(
            max(0.0, self.prefill_s - other.prefill_s),
            max(0.0, self.decode_s - other.decode_s),
            max(0, self.prefill_tokens - other.prefill_tokens),
        )

    def __add__(self, other: Work) -> Work:
        return Work(
            self.prefill_s + other.prefill_s,
            self.decode_s + other.decode_s,
            self.prefill_tokens + other.prefill_tokens,
        )


def _server_work(url: str) -> Work | None:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            text = r.read().decode()
    except OSError:
        return None
    sums = {PREFILL_SUM: 0.0, DECODE_SUM: 0.0}
    tokens = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in sums:
                sums[s.name] += s.value
            elif s.name == "vllm:prompt_tokens_total":
                tokens += s.value
    return Work(sums[PREFILL_SUM], sums[DECODE_SUM], int(tokens))


class WorkMeter:
    """The process's running totals; `reading(servers)` is what tests have asked so far."""

    def __init__(self) -> None:
        self._engine = Work()
        self._lock = threading.Lock()
        self._servers: dict[str, Work] = {}  # URL -> its last reading
        self._gone: dict[str, Work] = {}  # servers that stopped answering: their last one
        self._patched = False
        self._counted: weakref.WeakSet[Any] = weakref.WeakSet()

    def on_step(self, sample: StepSample) -> None:
        if sample.idle:
            return
        tokens = sample.prefill_tokens + sample.decode_tokens
        # A step that ran both is split by its tokens: an estimate, as the whole is.
        prefill = sample.duration_s * sample.prefill_tokens / tokens if tokens else 0.0
        with self._lock:
            self._engine += Work(prefill, sample.duration_s - prefill, sample.prefill_tokens)

    def count_engines(self) -> None:
        """Every VllmEngine started from now on is counted (once engine.vllm.engine is
        imported: importing it here would import vLLM for tests that need none)."""
        module: Any = sys.modules.get("engine.vllm.engine")
        if module is None or self._patched:
            return
        self._patched = True
        original = module.VllmEngine.start
        meter = self

        def start(engine: Any, *args: Any, **kwargs: Any) -> Any:
            card = original(engine, *args, **kwargs)
            meter.count(engine)
            return card

        module.VllmEngine.start = start

    def count(self, engine: Any) -> None:
        """Count this started engine's steps (once, however often it is asked)."""
        with self._lock:
            if engine in self._counted:
                return
            self._counted.add(engine)
        engine.add_step_listener(self.on_step)

    def watch_server(self, url: str) -> None:
        with self._lock:
            if url not in self._gone:
                self._servers.setdefault(url, Work())

    def reading(self, servers: bool) -> Work:
        """The engines' totals, and with `servers` every watched server's, read now (a
        server that no longer answers keeps its last reading)."""
        with self._lock:
            total = self._engine
            urls = list(self._servers) if servers else []
        for url in urls:
            got = _server_work(url)
            with self._lock:
                total += got if got is not None else self._servers[url]
                if got is None:
                    # Stopped or killed: its work is all in, and no test waits on it again.
                    self._gone[url] = self._servers.pop(url)
                else:
                    self._servers[url] = got
        with self._lock:
            for last in [*self._gone.values(), *([] if servers else self._servers.values())]:
                total += last
        return total


METER = WorkMeter()
