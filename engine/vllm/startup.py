"""Start-up of the in-process engine: where vLLM's logs go, and what its start-up failures
mean in kvscope's typed errors (with the numbers that explain them)."""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import BadOption, EngineStartFailed, KvPoolTooSmall, KvscopeError, ModelNotFound
from engine.model_geometry import config_fields, read_attention_geometry
from engine.nvml import gpu_processes
from engine.paths import UnsafeFolder, open_fallback_log, open_private_log
from engine.sizes import GIB
from engine.vllm.gpu_start_errors import map_gpu_start_error
from engine.vllm.worker_logs import WORKER_FAILED, worker_failure, worker_logging

LOG = logging.getLogger("vllm")


@dataclass(frozen=True)
class LogRoute:
    """Where vLLM's log lines went: `path` is None when nowhere could take them."""

    wanted: Path
    path: Path | None
    problem: str | None = None

    def notice(self) -> str | None:
        """One line for the user when the log is not where the README says it is."""
        if self.problem is None:
            return None
        where = f"it goes to {self.path}" if self.path else "it is not kept"
        return f"cannot write vLLM's log to {self.wanted} ({self.problem}); {where}"


def _open_log(path: Path) -> logging.Handler:
    return logging.StreamHandler(open_private_log(path))  # 0600 in a 0700 folder


def route_vllm_logs(path: str | os.PathLike[str]) -> LogRoute:
    """Send vLLM's log lines to a file: on a terminal UI they would tear the screen.

    A cache folder that cannot be written (read-only, full) must not stop the engine: the
    log then goes to a private folder in the system's temp folder, or nowhere. Call it
    before vLLM is imported, or vLLM installs its own handler on stderr first.
    """
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    for h in LOG.handlers:
        route = getattr(h, "_kvscope", None)
        if isinstance(route, LogRoute):
            return route
    wanted = Path(path)
    handler: logging.Handler
    try:
        handler = _open_log(wanted)
        route = LogRoute(wanted, wanted)
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
        try:
            fallback, stream = open_fallback_log()  # only a private folder of this user's
            handler = logging.StreamHandler(stream)
            route = LogRoute(wanted, fallback, problem)
        except OSError as refused:
            handler = logging.NullHandler()
            why = f"; {refused.strerror}" if isinstance(refused, UnsafeFolder) else ""
            route = LogRoute(wanted, None, problem + why)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._kvscope = route  # type: ignore[attr-defined]
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    return route


def keep_workers_logging(args: Any, route: LogRoute) -> None:
    """vLLM's worker processes (tensor, pipeline parallel) log into kvscope's engine log,
    not onto the terminal under the UI, unless the user configured vLLM's logging."""
    if args.logging_config is not None or getattr(args, "log_config_file", None):
        return
    handler = next((h for h in LOG.handlers if getattr(h, "_kvscope", None) is route), None)
    where = worker_logging(handler or logging.NullHandler(), route.path)
    if where is None:
        return
    from vllm.config.logging import LoggingConfig

    from engine.vllm.internals import configured_here

    config = LoggingConfig(configure_logging=True, pylogging_config_file=str(where))
    args.logging_config = config
    # kvscope's own process logs through its handler already: only the workers apply it.
    configured_here(config)


def map_start_error(
    exc: BaseException,
    *,
    model: str,
    max_model_len: int | None,
    kv_bytes_per_token: int | None,
    block_size: int | None,
    kv_cache_memory_bytes: int | None,
    log_path: Path | None = None,
) -> KvscopeError:
    """Turn what vLLM raised at start-up into one of kvscope's typed errors.

    The user reads one line; the whole of vLLM's text, traceback included, goes to
    engine.log, so nothing that explains the failure is lost.
    """
    if isinstance(exc, KvscopeError):
        return exc
    LOG.error("kvscope: the engine failed to start", exc_info=exc)
    text = f"{type(exc).__name__}: {exc}"
    worker = worker_failure(log_path) if WORKER_FAILED in text else None
    on_gpu = map_gpu_start_error(worker or text, gpu_processes)
    if on_gpu is not None:
        return on_gpu
    if WORKER_FAILED in text:
        kept = f"; the whole trace is in {log_path}" if log_path else ""
        return EngineStartFailed(
            f"a vLLM worker process failed to start: {worker}{kept}"
            if worker
            else f"a vLLM worker process failed to start, and said why only on its own stderr{kept}"
        )
    m = re.search(
        r"max seq len \((\d+)\).*?([\d.]+) GiB KV cache is needed.*?available KV cache "
        r"memory \(([\d.]+) GiB\)",
        text,
        re.S,
    )
    if m:
        length = int(m.group(1))
        est = re.search(r"estimated maximum model length is (\d+)", text)
        needed = int(float(m.group(2)) * GIB)
        if kv_bytes_per_token:
            # vLLM rounds to 2 decimals of a GiB; our own geometry is exact.
            bs = block_size or 1
            needed = math.ceil(length / bs) * bs * kv_bytes_per_token
        available = kv_cache_memory_bytes or int(float(m.group(3)) * GIB)
        return KvPoolTooSmall(needed, available, int(est.group(1)) if est else None, length)
    if "No available memory for the cache blocks" in text:
        # Not even one block fits. vLLM says no numbers here, so resolve the defaults the
        # caller left unset (the model's own context, its KV bytes, the block size).
        geometry = {} if max_model_len and kv_bytes_per_token else read_geometry(model)
        context = max_model_len or geometry.get("max_position_embeddings")
        per_token = kv_bytes_per_token or geometry.get("kv_bytes_per_token")
        bs = block_size or _default_block_size()
        needed = math.ceil(context / bs) * bs * per_token if context and per_token else 0
        available = kv_cache_memory_bytes or 0
        fits = available // (bs * per_token) * bs if per_token else None
        return KvPoolTooSmall(needed, available, fits, context)
    too_long = re.search(
        r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
        r"\((\w+)=([\d.]+)",
        text,
    )
    if too_long:
        asked, key, limit = int(too_long.group(1)), too_long.group(2), int(float(too_long.group(3)))
        return BadOption(
            "--max-model-len",
            f"{asked:,} is more than this model's limit of {limit:,} ({key} in its "
            f"config.json); use --max-model-len {limit} or less",
        )
    block = re.search(r"No common block size for (\d+) \((.*)\)", text)
    if block:
        return BadOption(
            "--block-size",
            f"{block.group(1)} does not suit the attention backend here ({block.group(2)}); "
            "leave --block-size out to use the backend's own",
        )
    not_found = (
        "not a valid model identifier",
        "does not appear to have",
        "Repository Not Found",
        "RepositoryNotFoundError",
        "LocalEntryNotFoundError",
        "Invalid repository ID",
        "is not a local folder",
        "Can't load the configuration",
        "couldn't connect",
        "OfflineModeIsEnabled",
        "Cannot find any model",
    )
    # A missing file is the model only when it is the model's path: a missing compiler
    # header or a library is something else, and "Model not found" would mislead.
    missing_model = "No such file or directory" in text and (model in text or "config.json" in text)
    if missing_model or any(s.lower() in text.lower() for s in not_found):
        return ModelNotFound(model, reason(exc, limit=200))
    return EngineStartFailed(f"{type(exc).__name__}: {reason(exc)}")


def reason(exc: BaseException, *, limit: int = 400) -> str:
    """The lines of an exception that say why, without the wrapping around them.

    pydantic puts "1 validation error for ModelConfig" first and the reason after it;
    a first-line-only message kept the wrapper and lost the reason.
    """
    kept: list[str] = []
    for raw in str(exc).splitlines():
        line = raw.strip()
        if not line or re.match(r"\d+ validation errors? for \w+$", line):
            continue
        if line.startswith("For further information visit"):
            continue
        line = re.sub(r"^Value error, ", "", line)
        line = re.sub(r"\s*\[type=.*$", "", line)
        kept.append(line)
        if len(kept) == 3:
            break
    said = " ".join(kept) or type(exc).__name__
    if len(said) > limit:
        cut = said.rfind(". ", 0, limit)
        said = said[: cut + 1] if cut > limit // 2 else said[: limit - 1] + "…"
    return said


def _default_block_size() -> int:
    # What vLLM picks when --block-size is not given: 128 tokens on the CPU backend
    # (measured), 16 on CUDA.
    try:
        from vllm.platforms import current_platform

        return 128 if current_platform.is_cpu() else 16
    except Exception:
        return 16


def read_geometry(model: str) -> dict[str, int]:
    """KV bytes per token and the model's own context from its config, to explain a
    too-small pool exactly."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model)
        cfg = getattr(cfg, "text_config", None) or cfg
        attention = read_attention_geometry(config_fields(cfg))
        geometry = {"kv_bytes_per_token": attention.kv_bytes_per_token(2)}
        if attention.max_position_embeddings:
            geometry["max_position_embeddings"] = attention.max_position_embeddings
        return geometry
    except Exception:
        return {}
