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
from typing import TYPE_CHECKING, Any

from engine.events import (
    EngineEvent,
    FinishReason,
    RequestAccepted,
    RequestFinished,
    ServerTimings,
)
from engine.visible_text import well_formed

if TYPE_CHECKING:
    from engine.request_book import RequestTimes


def _seconds(ms: Any) -> float | None:
    return float(ms) / 1000.0 if isinstance(ms, int | float) else None


def cached_prompt_tokens(usage: Any) -> int | None:
    """The prefix-cache hit the server reports in its usage block
    (`--enable-prompt-tokens-details`), whether or not it also sends per-request metrics."""
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
    return None


def server_timings(metrics: Any, usage: Any) -> ServerTimings | None:
    """vLLM's per-request `metrics` object (ms) in seconds, with the cached prompt tokens."""
    cached = cached_prompt_tokens(usage)
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
        message = well_formed(message)[0]  # the server's words, printed and taped
        super().__init__(status, message)
        self.status = status
        self.message = message


class ReplyAssembler:
    """Turns one request's chunks into RequestAccepted, TokenEvents and RequestFinished."""

    def __init__(
        self, times: RequestTimes, prompt_tokens: int | None = None, *, server_counts: bool = True
    ) -> None:
        self.times = times  # the request's own: its tokens are stamped there
        self.request_id = times.request_id
        self.submitted_at = times.submitted_at
        self.prompt_tokens = prompt_tokens
        # vLLM counts with the model's own tokenizer; another server's usage block may not
        # (GuideLLM's mock splits words): there the count made on this side stands.
        self.server_counts = server_counts
        self.accepted = False
        self.chunks = 0
        self.reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.metrics: Any = None
        self.done = False
        # Lone surrogates in the server's text, each kept as U+FFFD (well_formed()).
        self.replaced = 0

    @property
    def tokens(self) -> int:
        return self.times.tokens

    def accept(self) -> RequestAccepted | None:
        """RequestAccepted, once, as soon as the prompt length is known."""
        if self.accepted or self.prompt_tokens is None:
            return None
        self.accepted = True
        return RequestAccepted(self.request_id, self.prompt_tokens, self.submitted_at)

    def on_chunk(self, chunk: dict[str, Any], arrived: float) -> list[EngineEvent]:
        # Once a chunk, hundreds of streams at once: each key is looked up once, and a
        # token's chunk (one choice, prompt length known) takes the shortest way through.
        choices = chunk.get("choices")
        if not choices and "error" in chunk:
            err = chunk["error"]
            if isinstance(err, dict):
                raise StreamError(int(err.get("code") or 500), str(err.get("message", err)))
            raise StreamError(500, str(err))
        out: list[EngineEvent] = []
        first = choices[0] if choices else None
        choice: dict[str, Any] = first if isinstance(first, dict) else {}
        usage = chunk.get("usage")
        metrics = chunk.get("metrics")
        if self.prompt_tokens is None:
            prompt_ids = chunk.get("prompt_token_ids") or choice.get("prompt_token_ids")
            if isinstance(prompt_ids, list):
                self.prompt_tokens = len(prompt_ids)
            elif isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = int(usage["prompt_tokens"])
        if not self.accepted:
            accepted = self.accept()
            if accepted is not None:
                out.append(accepted)
        if isinstance(usage, dict):
            self.usage = usage
        if metrics is not None:
            self.metrics = metrics
        if not choice:
            return out
        delta = choice.get("delta")
        text = str((delta.get("content") if isinstance(delta, dict) else choice.get("text")) or "")
        if not text.isascii():
            # JSON may escape half a UTF-16 pair: no character, and no UTF-8 for a tape,
            # a pipe or a terminal. The text is kept, that code point as U+FFFD.
            text, bad = well_formed(text)
            self.replaced += bad
        ids = choice.get("token_ids")
        if type(ids) is list:
            # One ID, already a whole number, as nearly every chunk has: no map().
            token_ids = (ids[0],) if len(ids) == 1 and type(ids[0]) is int else tuple(map(int, ids))
            count = len(token_ids)
        else:  # no IDs: a token if it has text; IDs that are not a list: none
            token_ids = ()
            count = 1 if text and ids is None else 0
        if count:
            if not self.accepted:
                # No prompt length came with the first tokens: accept with 0 (unknown).
                self.accepted = True
                out.append(RequestAccepted(self.request_id, 0, self.submitted_at))
            self.chunks += 1
            # A remote engine has no steps: the chunk number stands in for one.
            out.append(self.times.token(token_ids, text, step=self.chunks, at=arrived, count=count))
        reason = choice.get("finish_reason")
        if reason is not None:
            self.reason = reason
        return out

    @property
    def finished_by_server(self) -> bool:
        return self.reason is not None

    def finish(self, now: float, reason: FinishReason | None = None) -> RequestFinished:
        self.done = True
        # The server's own count (usage block) wins over the client's.
        served = self.usage.get("prompt_tokens") if self.usage and self.server_counts else None
        final = self.times.finished(
            reason or finish_reason(self.reason),
            now,
            prompt_tokens=served if isinstance(served, int) else (self.prompt_tokens or 0),
        )
        timings = server_timings(self.metrics, self.usage)
        # The cached count is the request's own figure, as vLLM's num_cached_tokens is
        # in-process: the footer, the load runner and the JSON read it there.
        return dataclasses.replace(
            final, server=timings, cached_prompt_tokens=cached_prompt_tokens(self.usage)
        )
