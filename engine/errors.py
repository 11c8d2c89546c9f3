"""Typed errors, each carrying the numbers that explain it.

`plain()` is the sentence a user reads; the UI and the CLI show it instead of a traceback.
"""

from __future__ import annotations

from engine.byte_size import in_unit
from engine.sizes import GIB


def _size(n: int) -> str:
    """A byte count a reader can check: GiB with the exact bytes, or plain bytes when a
    GiB figure would round to 0.00 and hide the number that explains the error."""
    if n >= GIB // 100:
        return f"{in_unit(n, 'GiB', 2)} ({n:,} bytes)"
    return f"{n:,} byte" + ("" if n == 1 else "s")


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
        # vLLM's rule: the reply needs at least one token of the context, so a prompt of
        # exactly max_model_len tokens is already one too many.
        most = self.max_model_len - 1
        over = self.prompt_tokens - most
        return (
            f"Prompt too long: {self.prompt_tokens:,} tokens, but the context limit "
            f"(max_model_len) is {self.max_model_len:,} and the reply needs at least one "
            f"token of it, so a prompt can have at most {most:,} ({over:,} over). "
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
        if self.estimated_max_len:
            advice = (
                f" At most about {self.estimated_max_len:,} tokens would fit: "
                f"use --max-model-len {self.estimated_max_len} or a bigger KV pool."
            )
        elif self.estimated_max_len == 0:
            # Not even one block fits: a shorter context cannot help, only a bigger pool.
            advice = (
                " Not one block of KV fits in that: use --kv-cache-memory-bytes "
                f"{self.needed_bytes} or more."
            )
        else:
            advice = " Use a smaller --max-model-len or a bigger KV pool."
        return (
            f"KV pool too small: one request{length} needs {_size(self.needed_bytes)} "
            f"of KV cache, but only {_size(self.available_bytes)} is available.{advice}"
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


class UnknownFlag(KvscopeError):
    """A flag that neither kvscope nor vLLM knows."""

    def __init__(self, flags: str, command: str = "kvscope") -> None:
        super().__init__(flags, command)
        self.flags = flags
        self.command = command

    def plain(self) -> str:
        return (
            f"Unknown flag: {self.flags}. Neither kvscope nor vLLM has it; "
            f"`{self.command} --help` and `kvscope engine-help` list the flags."
        )


class CacheDirUnwritable(KvscopeError):
    """kvscope had to write in its cache folder (to convert the model) and could not."""

    def __init__(self, folder: str, detail: str = "") -> None:
        super().__init__(folder, detail)
        self.folder = folder
        self.detail = detail

    def plain(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"Cannot write to kvscope's cache folder {self.folder}{why}. The converted model "
            "lives there: set KVSCOPE_CACHE_DIR to a writable folder, or run "
            "`kvscope prepare-model` once as a user who can write there."
        )


class RequestRejected(KvscopeError):
    """The running engine refused one request; the engine itself goes on."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(request_id, reason)
        self.request_id = request_id
        self.reason = reason

    def plain(self) -> str:
        return f"The engine refused this request: {self.reason}. The engine is still running."


class DuplicateRequestId(KvscopeError):
    """A stream of this request ID is still open; every engine refuses a second one."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id

    def plain(self) -> str:
        return (
            f"Request ID {self.request_id!r} is already running: a new request needs an ID "
            "of its own, or must wait until that one has finished. The engine is still "
            "running."
        )


class ServerUnreachable(KvscopeError):
    """No vLLM server answered at the URL (refused, timed out, name unknown, TLS)."""

    def __init__(self, url: str, detail: str = "") -> None:
        super().__init__(url, detail)
        self.url = url
        self.detail = detail

    def plain(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"No vLLM server answers at {self.url}{why}. Check that it is running and that "
            "the URL, port and http/https are right, then retry."
        )


class AuthRequired(KvscopeError):
    """The server answered 401 or 403: it wants an API key, or refused the one sent."""

    def __init__(self, url: str, status: int = 401, key_sent: bool = False) -> None:
        super().__init__(url, status, key_sent)
        self.url = url
        self.status = status
        self.key_sent = key_sent

    def plain(self) -> str:
        if self.key_sent:
            return (
                f"The server at {self.url} wants an API key and refused the one sent "
                f"(HTTP {self.status}). Pass the server's --api-key value with --api-key or "
                "VLLM_API_KEY."
            )
        return (
            f"The server at {self.url} wants an API key (HTTP {self.status}). Pass it with "
            "--api-key, or set VLLM_API_KEY or OPENAI_API_KEY."
        )


class ConnectionLost(KvscopeError):
    """The connection to the server broke while a reply was streaming."""

    def __init__(self, tokens_received: int, url: str = "", detail: str = "") -> None:
        super().__init__(tokens_received, url, detail)
        self.tokens_received = tokens_received
        self.url = url
        self.detail = detail

    def plain(self) -> str:
        where = f" to {self.url}" if self.url else ""
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"Connection{where} lost after {self.tokens_received:,} tokens{why}. The reply so "
            "far is kept; the next request reconnects once the server is back."
        )


def _holders_sentence(holders: tuple[str, ...]) -> str:
    return f" Held by {', '.join(holders)}." if holders else ""


class DeviceMemoryTaken(KvscopeError):
    """The GPU has less free memory than --gpu-memory-utilization asks vLLM to take: most
    often a `vllm serve` (or another kvscope) already holds it."""

    def __init__(
        self,
        device: str,
        free_gib: float,
        total_gib: float,
        utilization: float,
        wanted_gib: float,
        holders: tuple[str, ...] = (),
    ) -> None:
        super().__init__(device, free_gib, total_gib, utilization, wanted_gib, holders)
        self.device = device
        self.free_gib = free_gib
        self.total_gib = total_gib
        self.utilization = utilization
        self.wanted_gib = wanted_gib
        self.holders = holders

    def suggested_utilization(self) -> float:
        """The largest fraction, in hundredths, that the free memory can still give."""
        share = self.free_gib / self.total_gib if self.total_gib else 0.0
        return max(0.0, int(share * 100 - 1) / 100)

    def plain(self) -> str:
        return (
            f"{self.device} has {self.free_gib:,.2f} of {self.total_gib:,.2f} GiB free, less "
            f"than --gpu-memory-utilization {self.utilization:g} asks for "
            f"({self.wanted_gib:,.2f} GiB).{_holders_sentence(self.holders)} Attach to a "
            "server that already runs with `kvscope --url http://HOST:PORT`, or start with "
            f"--gpu-memory-utilization {self.suggested_utilization():g} or less."
        )


class DeviceOutOfMemory(KvscopeError):
    """torch ran out of GPU memory while the engine started (weights, warm-up, graphs)."""

    def __init__(
        self,
        tried: str,
        device: str = "",
        total: str = "",
        free: str = "",
        holders: tuple[str, ...] = (),
    ) -> None:
        super().__init__(tried, device, total, free, holders)
        self.tried = tried
        self.device = device
        self.total = total
        self.free = free
        self.holders = holders

    def plain(self) -> str:
        state = f" {self.device} had {self.free} free of {self.total}." if self.device else ""
        return (
            f"The GPU ran out of memory while the engine started: it tried to allocate "
            f"{self.tried}.{state}{_holders_sentence(self.holders)} Lower "
            "--gpu-memory-utilization or --max-model-len, raise --tensor-parallel-size, or "
            "use a smaller or quantized model."
        )


class DeviceTooOld(KvscopeError):
    """bfloat16 needs compute capability 8.0 (Ampere) or newer."""

    def __init__(self, gpu: str, capability: str | None) -> None:
        super().__init__(gpu, capability)
        self.gpu = gpu
        self.capability = capability

    def plain(self) -> str:
        has = (
            f"has compute capability {self.capability}"
            if self.capability
            else "reports no compute capability"
        )
        return (
            f"This model computes in bfloat16, which needs a GPU of compute capability 8.0 or "
            f"newer; the {self.gpu} {has}. Start it with --dtype half."
        )


class CompilerMissing(KvscopeError):
    """torch.compile or Triton could not build kernels: no C compiler or no Python headers."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing

    def plain(self) -> str:
        return (
            f"The engine compiles its kernels at start-up and {self.missing}. Install a C "
            "compiler and Python's headers (Debian: gcc python3-dev), or start with "
            "--enforce-eager, which skips compilation."
        )
