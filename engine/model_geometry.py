"""A model's attention geometry, read from its Hugging Face config: the one reader of it.

The roofline (from a `config.json` dict), the in-process engine's model card and its
start-up errors (from the config objects transformers and vLLM load) all read the layer
count, the KV heads and the head size here, with the same defaults, so a model's KV bytes
per token are the same number wherever kvscope shows them. Its parameter count lives here
too: the memory bar checks vLLM's weights figure against it. No vLLM, no transformers:
the config objects are read as mappings (`config_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import BadOption
from engine.sizes import kv_bytes_per_token

# What `config_fields` copies off a config object: every key the geometry and the
# roofline's parameter count read.
CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
)


def config_fields(config: object) -> dict[str, Any]:
    """A transformers or vLLM config object as the mapping this module reads.

    Read attribute by attribute, not with `to_dict()`: a config's `attribute_map` (GPT-2's
    `n_layer` for `num_hidden_layers`, say) only answers to the attribute names. A key the
    config does not set is left out, as it would be from its `config.json`.
    """
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        value = getattr(config, key, None)
        if value is not None:
            out[key] = value
    return out


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs nest the language model's geometry under `text_config`."""
    inner = cfg.get("text_config")
    if isinstance(inner, Mapping) and "hidden_size" in inner and "hidden_size" not in cfg:
        return inner
    return cfg


def config_int(cfg: Mapping[str, Any], key: str) -> int:
    """A positive whole number the config must hold; BadOption names the key otherwise."""
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadOption(
            "model config",
            f"config.json needs a positive integer {key!r} (got {value!r})",
        )
    return value


def num_kv_heads(cfg: Mapping[str, Any], heads: int) -> int:
    # Configs from before grouped-query attention leave it out: one KV head per query head.
    return int(cfg.get("num_key_value_heads") or heads)


def head_dim(cfg: Mapping[str, Any], hidden: int, heads: int) -> int:
    # Some configs (Qwen3, Gemma) set head_dim apart from hidden/heads; others leave it out
    # or null, and the model then uses hidden // heads.
    explicit = cfg.get("head_dim")
    if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > 0:
        return explicit
    return hidden // heads


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """What a model's KV cache is shaped by, and the context its config allows."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    max_position_embeddings: int | None  # None when the config does not say

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype_bytes)


def read_attention_geometry(cfg: Mapping[str, Any]) -> AttentionGeometry:
    """The geometry of a decoder's text model (`text_config` when the config nests one).

    Raises BadOption when a size the KV cache depends on is missing or not a positive
    whole number.
    """
    text = text_config(cfg)
    hidden = config_int(text, "hidden_size")
    heads = config_int(text, "num_attention_heads")
    positions = text.get("max_position_embeddings")
    return AttentionGeometry(
        num_layers=config_int(text, "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=num_kv_heads(text, heads),
        head_dim=head_dim(text, hidden, heads),
        hidden_size=hidden,
        max_position_embeddings=int(positions) if positions else None,
    )


# Model types whose attention has biases on q, k and v but not on o (Qwen2's layout).
_QKV_BIAS_MODEL_TYPES = frozenset({"qwen2"})
# Model types with a per-head RMSNorm on q and k (weights of head_dim each).
_QK_NORM_MODEL_TYPES = frozenset({"qwen3"})
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def count_parameters(cfg: Mapping[str, Any]) -> int:
    """Parameters of a Llama/Qwen2-style decoder, counted from its config (no weights read).

    With h = hidden_size, i = intermediate_size, V = vocab_size, n_q = attention heads,
    n_kv = KV heads, d = head_dim, N = layers:

        embeddings      V * h
        per layer       q_proj h * n_q*d, k_proj and v_proj h * n_kv*d each, o_proj n_q*d * h
                        + q/k/v biases n_q*d + 2*n_kv*d   (Qwen2, or attention_bias)
                        + o bias h                        (attention_bias only, not Qwen2)
                        + q/k RMSNorm 2*d                 (Qwen3)
                        + gated MLP 3 * h * i             (gate, up, down projections)
                        + MLP biases 2*i + h              (mlp_bias only)
                        + 2 RMSNorms 2 * h
        final norm      h
        lm_head         V * h, unless tie_word_embeddings reuses the embedding matrix

    Rotary embeddings have no parameters. SmolLM2-135M counts 134,515,008, the number of
    values in its safetensors file. Raises BadOption for mixture-of-experts configs (one
    `intermediate_size` does not describe their experts) and for a missing size.
    """
    cfg = text_config(cfg)
    if any(cfg.get(k) for k in _MOE_KEYS):
        raise BadOption(
            "model config",
            "mixture-of-experts models are not supported by the parameter count",
        )
    h = config_int(cfg, "hidden_size")
    i = config_int(cfg, "intermediate_size")
    vocab = config_int(cfg, "vocab_size")
    attention = read_attention_geometry(cfg)
    layers, n_q = attention.num_layers, attention.num_attention_heads
    n_kv, d = attention.num_kv_heads, attention.head_dim
    model_type = str(cfg.get("model_type", "")).lower()
    tied = bool(cfg.get("tie_word_embeddings", False))

    attn = h * n_q * d + 2 * h * n_kv * d + n_q * d * h
    if model_type in _QKV_BIAS_MODEL_TYPES:
        attn += n_q * d + 2 * n_kv * d
    elif cfg.get("attention_bias"):
        attn += n_q * d + 2 * n_kv * d + h
    if model_type in _QK_NORM_MODEL_TYPES:
        attn += 2 * d
    mlp = 3 * h * i
    if cfg.get("mlp_bias"):
        mlp += 2 * i + h
    per_layer = attn + mlp + 2 * h

    embeddings = vocab * h
    # A tied lm_head is the embedding matrix itself: counted once.
    lm_head = 0 if tied else vocab * h
    return embeddings + layers * per_layer + h + lm_head
