"""Size constants and the one formula for KV-cache bytes per token: every engine's model
card, the start-up errors and the roofline compute it here."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3

# Bytes per element of the KV cache's dtype; fp8 caches are one byte whatever the model's.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """One K and one V vector per layer per KV head: 2 × layers × heads × head_dim × bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def dtype_bytes(dtype: str, cache_dtype: str = "auto") -> int:
    """Bytes per KV element for a model dtype such as "bfloat16" and vLLM's cache dtype."""
    if cache_dtype.startswith("fp8"):
        return 1
    return DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
