"""Prefill here, decode there: each request's prompt prefilled on one server, its KV cache
handed to another by vLLM's KV connector (`--kv-transfer-config`), which decodes it.

kvscope is the proxy, as vLLM's own disaggregated-serving example proxy is: the request
goes to the prefill server first, not streamed, with `max_tokens` 1 and
`kv_transfer_params` asking it to keep its KV for a remote decode. Its answer's
`kv_transfer_params` (where the KV is: NIXL's engine, host, port and block IDs; nothing
for a connector that finds KV by the prompt's blocks, as ExampleConnector does in its
shared folder) go with the same request to the decode server, which loads that KV
instead of computing it, and streams the reply.

The TTFT is the client's, from when the caller asked to the decode server's first token:
the prefill server's whole answer, then the hand-off (the KV's transfer and the decode
server's first step, measured between the two, as no connector kvscope can see reports
the transfer apart). What the decode server did not compute is its counter's delta
(`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`) when the request
ran alone, which tells KV loaded from KV it had cached itself; else its answer's
`cached_tokens`, which counts both (and, with NIXL's parameters, the prefill server's
own cache hits instead: then it is not used).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from engine.errors import ConnectionLost, ServerUnreachable
from engine.events import HandOff, RequestFinished
from engine.fleet.attribution import Attribution
from engine.fleet.round_robin import RoundRobinEngine
from engine.remote.metrics import parse_metrics
from engine.remote.streaming import server_timings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from engine.events import EngineEvent, GenerationRequest, ModelCard, ProgressCallback
    from engine.remote import RemoteEngine
    from engine.remote.engine import WholeAnswer

# What vLLM's disaggregated proxy example sends the prefill server: keep the KV for a
# decode elsewhere. The decode server gets the prefill server's answer in its place.
PREFILL_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
EXTERNAL_SOURCE = "external_kv_transfer"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
NIXL_TIME = "vllm:nixl_xfer_time_seconds_sum"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
CACHE_INFO = "vllm:cache_config_info"
# How long the decode server's counter may lag its last chunk: vLLM's stat loggers count
# a finished request in the same step, but the HTTP answer can beat the next /metrics.
COUNTER_GRACE_S = 1.0


@dataclass(frozen=True)
class DecodeCounters:
    """What one /metrics text of the decode server says about KV that came from elsewhere
    (None where it says nothing): totals since it started, but `kv_bytes_per_token`."""

    external_tokens: float | None
    """Prompt tokens taken from a KV connector: `prompt_tokens_by_source_total{source=
    "external_kv_transfer"}`, else the connector's prefix-cache hits (the same tokens)."""
    transfer_s: float | None  # NIXL's own transfer time (vllm:nixl_xfer_time_seconds)
    transfer_bytes: float | None  # and its bytes (vllm:nixl_bytes_transferred)
    kv_bytes_per_token: float | None
    """The pool's bytes over its tokens (cache_config_info, where the server was given
    --kv-cache-memory-bytes): what a token's KV weighs on this server."""

    @classmethod
    def parse(cls, text: str | None) -> DecodeCounters | None:
        if text is None:
            return None
        parsed = parse_metrics(text)

        def total(name: str) -> float | None:
            found = parsed.get(name)
            return sum(v for _, v in found) if found else None

        by_source = [
            v
            for labels, v in parsed.get(PROMPT_BY_SOURCE)
            if labels.get("source") == EXTERNAL_SOURCE
        ]
        per_token = None
        for labels, _ in parsed.get(CACHE_INFO):
            pool, tokens = labels.get("kv_cache_memory_bytes"), labels.get("kv_cache_size_tokens")
            if pool and tokens and pool.isdigit() and tokens.isdigit() and int(tokens) > 0:
                per_token = int(pool) / int(tokens)
        return cls(
            sum(by_source) if by_source else total(EXTERNAL_HITS),
            total(NIXL_TIME),
            total(NIXL_BYTES),
            per_token,
        )


PROBE_TIMEOUT_S = 2.0  # a refused connection answers at once; this is for a silent host


def _answers(url: str) -> bool:
    """Whether any HTTP server answers at `url` (any status: it is up)."""
    try:
        httpx.get(url.rstrip("/") + "/v1/models", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True


class DisaggregatedEngine(RoundRobinEngine):
    """Every request's prefill on `prefill`, then its decode on `decode` (named replicas).

    The replicas are held as a round robin holds them (attached in order, one model on
    both, aborted and shut down together); only the route differs. The decode server
    stands for the pair where one server is needed: its card (the decode's context and
    pool), its scrapes in the charts, its prompts.
    """

    def __init__(self, prefill: tuple[str, RemoteEngine], decode: tuple[str, RemoteEngine]):
        super().__init__([decode, prefill])
        self.prefill_name, self.prefill = prefill
        self.decode_name, self.decode = decode
        self._in_flight = 0
        self._started = 0
        self._count_lock = threading.Lock()

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Attach to both servers (the decode server first); one that does not answer is
        named by its role, and whether the other answers: with both down, both are said."""
        try:
            return super().start(progress)
        except ServerUnreachable as exc:
            if exc.url == self.decode.url:
                down, other = f"the decode server ({self.decode_name})", self.prefill.url
                state = "answers" if _answers(other) else "does not answer either"
            else:  # the decode server was attached before it
                down, other, state = f"the prefill server ({self.prefill_name})", "", ""
            words = f"{exc.detail}; it is {down} of the prefill/decode pair"
            words += f", and the prefill server at {other} {state}" if other else ""
            raise ServerUnreachable(exc.url, words) from None

    def pick(self) -> str:
        return self.decode_name

    def routing_words(self) -> str:
        return (
            f"routing: kvscope's prefill/decode proxy: each prompt prefilled on "
            f"{self.prefill_name}, its KV handed to {self.decode_name} by the servers' KV "
            f"connector, decoded there; the charts are {self.decode_name}'s"
        )

    def attribution(self, request_id: str) -> Attribution:
        if self.served_by(request_id) is None:
            return Attribution(None, "none", "kvscope's proxy has no record of it")
        return Attribution(
            self.decode_name,
            "disaggregated",
            f"prefilled on {self.prefill_name}, decoded on {self.decode_name}",
        )

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        # The clock starts when the caller asks, before the prefill server is.
        return self._stream(request, time.perf_counter())

    async def _stream(self, request: GenerationRequest, asked: float) -> AsyncIterator[EngineEvent]:
        self.remember(request.request_id, self.decode_name)
        with self._count_lock:
            self._in_flight += 1
            self._started += 1
            alone, started = self._in_flight == 1, self._started
        try:
            # Read before the prefill: with no other request in flight, the decode server's
            # counter then moves by this request's loaded tokens only.
            before = await self._counters() if alone else None
            one_token = dataclasses.replace(request.sampling, max_tokens=1)
            try:
                prefilled = await self.prefill.answer(
                    dataclasses.replace(request, sampling=one_token),
                    {"kv_transfer_params": dict(PREFILL_PARAMS)},
                )
            except ServerUnreachable as exc:
                # A plain ServerUnreachable, not a stall: nothing came, nothing is lost.
                raise ServerUnreachable(exc.url, self._prefill_gone(exc.detail)) from None
            except ConnectionLost as exc:
                # The prefill server died while it prefilled: no token came either.
                raise ConnectionLost(0, exc.url, self._prefill_gone(exc.detail)) from None
            params = prefilled.data.get("kv_transfer_params")
            extra = {"kv_transfer_params": params} if isinstance(params, dict) else None
            async for event in self.decode.stream(request, submitted_at=asked, extra_body=extra):
                if isinstance(event, RequestFinished):
                    with self._count_lock:
                        alone = alone and self._started == started
                    event = await self._handed_off(event, asked, prefilled, params, before, alone)
                yield event
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def _prefill_gone(self, detail: str) -> str:
        """Why a request stopped at the prefill server, said about the pair."""
        role = (
            f"it is the prefill server ({self.prefill_name}), so nothing was sent to the "
            f"decode server ({self.decode_name})"
        )
        return f"{detail}; {role}" if detail else role

    async def _counters(self) -> DecodeCounters | None:
        return DecodeCounters.parse(await self.decode.fetch_text("/metrics"))

    async def _handed_off(
        self,
        ev: RequestFinished,
        asked: float,
        prefilled: WholeAnswer,
        params: Any,
        before: DecodeCounters | None,
        alone: bool,
    ) -> RequestFinished:
        prefill_s = prefilled.answered_at - asked
        handoff_s = None if ev.ttft_s is None else max(0.0, ev.ttft_s - prefill_s)
        after = await self._counters_after(before) if alone and before is not None else None
        loaded, source = self._loaded(ev, params, before, after)
        card = self.decode.card
        per_token = card.kv_bytes_per_token if card and card.kv_bytes_per_token else None
        if per_token is None and after is not None and after.kv_bytes_per_token:
            per_token = round(after.kv_bytes_per_token)
        handoff = HandOff(
            prefill_replica=self.prefill_name,
            decode_replica=self.decode_name,
            prompt_tokens=ev.prompt_tokens,
            prefill_s=prefill_s,
            handoff_s=handoff_s,
            loaded_tokens=loaded,
            loaded_source=source,
            block_size=card.block_size or None if card else None,
            kv_bytes_per_token=per_token,
            transfer_s=_delta(before, after, lambda c: c.transfer_s),
            transfer_bytes=_int(_delta(before, after, lambda c: c.transfer_bytes)),
            prefill_server=server_timings(
                prefilled.data.get("metrics"), prefilled.data.get("usage")
            ),
        )
        return dataclasses.replace(ev, handoff=handoff)

    async def _counters_after(self, before: DecodeCounters) -> DecodeCounters | None:
        """The decode server's counters once they have counted this request's KV (or the
        grace ran out: it took none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COUNTER_GRACE_S
        while True:
            after = await self._counters()
            if after is None or after.external_tokens is None or before.external_tokens is None:
                return after
            if after.external_tokens > before.external_tokens or loop.time() >= deadline:
                return after
            await asyncio.sleep(0.05)

    def _loaded(
        self,
        ev: RequestFinished,
        params: Any,
        before: DecodeCounters | None,
        after: DecodeCounters | None,
    ) -> tuple[int | None, str]:
        """The prompt tokens the decode server did not compute, and what that rests on."""
        counted = _delta(before, after, lambda c: c.external_tokens)
        if counted is not None:
            return round(counted), f"{self.decode_name}'s KV-connector counter"
        if isinstance(params, dict) and "remote_prefill_cached_tokens" in params:
            return None, (
                f"not known: {self.decode_name}'s cached_tokens are then the prefill's own "
                "cache hits, and its counter tells one request only when it runs alone"
            )
        if ev.cached_prompt_tokens is None:
            return None, f"not known: {self.decode_name} reports no cached_tokens"
        return ev.cached_prompt_tokens, (
            f"{self.decode_name}'s cached_tokens (its own prefix cache's hits too)"
        )


def _delta(
    before: DecodeCounters | None,
    after: DecodeCounters | None,
    field: Callable[[DecodeCounters], float | None],
) -> float | None:
    """How far one counter moved, None where either reading lacks it."""
    if before is None or after is None:
        return None
    a, b = field(after), field(before)
    return None if a is None or b is None else max(0.0, a - b)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)
