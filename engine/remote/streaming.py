"""One streamed reply: SSE chunks from /v1/chat/completions or /v1/completions to events.

Timing rules:
- the request's clock starts when the caller called `stream()` (`submitted_at`);
- every chunk gets the time its network read arrived; chunks from one read share it;
- a chunk may carry several tokens (vLLM merges outputs when the client lags, and
  `--stream-interval` batches them): they share that one arrival time, never spread out.
  So a TokenEvent may hold several token IDs, and the ITLs after its first token are 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.events import (
    EngineEvent,
    FinishReason,
    RequestAccepted,
    RequestFinished,
    ServerTimings,
    TokenEvent,
)


def _seconds(ms: Any) -> float | None:
    return float(ms) / 1000.0 if isinstance(ms, int | float) else None


def server_timings(metrics: Any, usage: Any) -> ServerTimings | None:
    """vLLM's per-request `metrics` object (ms) in seconds, with the cached prompt tokens."""
    cached = None
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = int(details["cached_tokens"])
    if not isinstance(metrics, dict):
        return None
    return ServerTimings(
        ttft_s=_seconds(metrics.get("time_to_first_token_ms")),
        mean_itl_s=_seconds(metrics.get("mean_itl_ms")),
        queue_s=_seconds(metrics.get("queue_time_ms")),
        generation_s=_seconds(metrics.get("generation_time_ms")),
        tokens_per_s=(
            float(metrics["tokens_per_second"])
            if isinstance(metrics.get("tokens_per_second"), int | float)
            else None
        ),
        cached_prompt_tokens=cached,
    )


def finish_reason(raw: Any) -> FinishReason:
    if raw == "length":
        return "length"
    if raw == "abort":
        return "abort"
    return "stop"


class StreamError(Exception):
    """The server put an error object into the stream instead of a chunk."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


class ReplyAssembler:
    """Turns one request's chunks into RequestAccepted, TokenEvents and RequestFinished."""

    def __init__(
        self, request_id: str, submitted_at: float, prompt_tokens: int | None = None
    ) -> None:
        self.request_id = request_id
        self.submitted_at = submitted_at
        self.prompt_tokens = prompt_tokens
        self.accepted = False
        self.token_times: list[float] = []
        self.chunks = 0
        self.reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.metrics: Any = None
        self.done = False

    @property
    def tokens(self) -> int:
        return len(self.token_times)

    def accept(self) -> RequestAccepted | None:
        """RequestAccepted, once, as soon as the prompt length is known."""
        if self.accepted or self.prompt_tokens is None:
            return None
        self.accepted = True
        return RequestAccepted(self.request_id, self.prompt_tokens, self.submitted_at)

    def on_chunk(self, chunk: dict[str, Any], arrived: float) -> list[EngineEvent]:
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"]
            if isinstance(err, dict):
                raise StreamError(int(err.get("code") or 500), str(err.get("message", err)))
            raise StreamError(500, str(err))
        out: list[EngineEvent] = []
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        prompt_ids = chunk.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if self.prompt_tokens is None and isinstance(prompt_ids, list):
            self.prompt_tokens = len(prompt_ids)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            if self.prompt_tokens is None and isinstance(self.usage.get("prompt_tokens"), int):
                self.prompt_tokens = int(self.usage["prompt_tokens"])
        if chunk.get("metrics") is not None:
            self.metrics = chunk["metrics"]
        accepted = self.accept()
        if accepted is not None:
            out.append(accepted)
        if not choice:
            return out
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        ids = choice.get("token_ids")
        token_ids = tuple(int(i) for i in ids) if isinstance(ids, list) else ()
        count = len(token_ids) if ids is not None else (1 if text else 0)
        if count:
            if not self.accepted:
                # No prompt length came with the first tokens: accept with 0 (unknown).
                self.accepted = True
                out.append(RequestAccepted(self.request_id, 0, self.submitted_at))
            self.chunks += 1
            prev = self.token_times[-1] if self.token_times else self.submitted_at
            out.append(
                TokenEvent(
                    request_id=self.request_id,
                    index=self.tokens,
                    token_ids=token_ids,
                    text=str(text),
                    step=self.chunks,  # a remote engine has no steps: the chunk number
                    time_s=arrived,
                    latency_s=arrived - prev,
                )
            )
            self.token_times.extend([arrived] * count)
        if choice.get("finish_reason") is not None:
            self.reason = choice["finish_reason"]
        return out

    @property
    def finished_by_server(self) -> bool:
        return self.reason is not None

    def finish(self, now: float, reason: FinishReason | None = None) -> RequestFinished:
        self.done = True
        # The server's own count (usage block) wins over the client's.
        served = self.usage.get("prompt_tokens") if self.usage else None
        final = RequestFinished.from_times(
            self.request_id,
            reason or finish_reason(self.reason),
            prompt_tokens=served if isinstance(served, int) else (self.prompt_tokens or 0),
            submitted_at=self.submitted_at,
            token_times=self.token_times,
            now=now,
        )
        timings = server_timings(self.metrics, self.usage)
        return dataclasses.replace(final, server=timings) if timings else final
