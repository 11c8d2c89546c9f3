"""Start-up of the in-process engine: where vLLM's logs go, and what its start-up failures
mean in kvscope's typed errors (with the numbers that explain them)."""

from __future__ import annotations

import logging
import math
import os
import re

from engine.errors import EngineStartFailed, KvPoolTooSmall, KvscopeError, ModelNotFound
from engine.sizes import GIB, kv_bytes_per_token


def route_vllm_logs(path: str | os.PathLike[str]) -> None:
    """Send vLLM's log lines to a file: on a terminal UI they would tear the screen."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    log = logging.getLogger("vllm")
    if not any(getattr(h, "_kvscope", False) for h in log.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._kvscope = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def map_start_error(
    exc: BaseException,
    *,
    model: str,
    max_model_len: int | None,
    kv_bytes_per_token: int | None,
    block_size: int | None,
    kv_cache_memory_bytes: int | None,
) -> KvscopeError:
    """Turn what vLLM raised at start-up into one of kvscope's typed errors."""
    if isinstance(exc, KvscopeError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
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
        return KvPoolTooSmall(
            (max_model_len or 0) * (kv_bytes_per_token or 0), 0, None, max_model_len
        )
    not_found = (
        "not a valid model identifier",
        "does not appear to have",
        "Repository Not Found",
        "RepositoryNotFoundError",
        "LocalEntryNotFoundError",
        "Invalid repository ID",
        "No such file or directory",
        "is not a local folder",
        "Can't load the configuration",
        "couldn't connect",
        "OfflineModeIsEnabled",
        "Cannot find any model",
    )
    if any(s.lower() in text.lower() for s in not_found):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ModelNotFound(model, first[:200])
    first_line = text.strip().splitlines()[0][:300]
    return EngineStartFailed(first_line)


def read_geometry(model: str) -> dict[str, int]:
    """KV bytes per token from the model's config, to explain a too-small pool exactly."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model)
        cfg = getattr(cfg, "text_config", None) or cfg
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return {"kv_bytes_per_token": kv_bytes_per_token(layers, kv, head_dim, 2)}
    except Exception:
        return {}
