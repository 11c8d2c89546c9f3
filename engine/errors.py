"""Typed errors, each carrying the numbers that explain it.

`plain()` is the sentence a user reads; the UI and the CLI show it instead of a traceback.
"""

from __future__ import annotations

GIB = 1024**3


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


class KvscopeError(Exception):
    """Base of every error a user can provoke."""

    def plain(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return self.plain()


class PromptTooLong(KvscopeError):
    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(prompt_tokens, max_model_len)
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len

    def plain(self) -> str:
        over = self.prompt_tokens - self.max_model_len
        return (
            f"Prompt too long: {self.prompt_tokens:,} tokens, but the context limit "
            f"(max_model_len) is {self.max_model_len:,}, {over:,} over. "
            "Shorten the prompt or start the engine with a larger --max-model-len."
        )


class KvPoolTooSmall(KvscopeError):
    def __init__(
        self,
        needed_bytes: int,
        available_bytes: int,
        estimated_max_len: int | None,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(needed_bytes, available_bytes, estimated_max_len, max_model_len)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.estimated_max_len = estimated_max_len
        self.max_model_len = max_model_len

    def plain(self) -> str:
        length = f" of {self.max_model_len:,} tokens" if self.max_model_len else ""
        advice = (
            f" At most about {self.estimated_max_len:,} tokens would fit: "
            f"use --max-model-len {self.estimated_max_len} or a bigger KV pool."
            if self.estimated_max_len
            else " Use a smaller --max-model-len or a bigger KV pool."
        )
        return (
            f"KV pool too small: one request{length} needs {_gib(self.needed_bytes)} "
            f"({self.needed_bytes:,} bytes) of KV cache, but only {_gib(self.available_bytes)} "
            f"({self.available_bytes:,} bytes) is available.{advice}"
        )


class ModelNotFound(KvscopeError):
    def __init__(self, path_or_id: str, detail: str = "") -> None:
        super().__init__(path_or_id, detail)
        self.path_or_id = path_or_id
        self.detail = detail

    def plain(self) -> str:
        extra = f" ({self.detail})" if self.detail else ""
        return (
            f"Model not found: {self.path_or_id!r} is neither a local model folder nor a "
            f"Hugging Face model this machine can reach{extra}."
        )


class EngineDied(KvscopeError):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause

    def plain(self) -> str:
        return f"The engine stopped: {self.cause}. Restart it to go on; the transcript is kept."


class EngineStartFailed(KvscopeError):
    """Start-up failed for a reason none of the specific errors covers."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause

    def plain(self) -> str:
        return f"The engine could not start: {self.cause}"


class BadOption(KvscopeError):
    """A flag or setting that cannot work, said before anything runs."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(option, reason)
        self.option = option
        self.reason = reason

    def plain(self) -> str:
        return f"Bad value for {self.option}: {self.reason}"
