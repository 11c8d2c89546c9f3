"""A model's geometry for the roofline: its shape, and its parameters counted from its
`config.json` (no weights are read). The attention sizes come from
`engine.model_geometry`, the reader the engines use too.

Pure Python on purpose: the TUI, the CLI and the tests import it without torch or vLLM.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from engine.model_geometry import (
    config_int,
    count_parameters,
    read_attention_geometry,
    text_config,
)
from engine.sizes import kv_bytes_per_token

if TYPE_CHECKING:
    from collections.abc import Mapping

# vLLM serves "auto"-dtype checkpoints in 16 bits (a float32 checkpoint is cast down), so
# 2 bytes per weight and per KV element is the default for every geometry.
DEFAULT_DTYPE_BYTES = 2


def count_params_from_hf_config(cfg: Mapping[str, Any]) -> int:
    """Parameters of a Llama/Qwen2-style decoder, from its `config.json`: the engine's
    one count (`engine.model_geometry.count_parameters`, which the memory bar uses too)."""
    return count_parameters(cfg)


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """The shape of a decoder-only transformer: all the roofline needs from a model."""

    name: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int
    tie_word_embeddings: bool
    intermediate_size: int
    max_position_embeddings: int

    @classmethod
    def from_hf_config(
        cls, cfg: Mapping[str, Any], name: str, dtype_bytes: int = DEFAULT_DTYPE_BYTES
    ) -> ModelGeometry:
        """Build from a Hugging Face `config.json` dict; see `count_params_from_hf_config`."""
        text = text_config(cfg)
        attention = read_attention_geometry(text)
        return cls(
            name=name,
            num_params=count_params_from_hf_config(text),
            num_layers=attention.num_layers,
            hidden_size=attention.hidden_size,
            num_attention_heads=attention.num_attention_heads,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            vocab_size=config_int(text, "vocab_size"),
            dtype_bytes=dtype_bytes,
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            intermediate_size=config_int(text, "intermediate_size"),
            max_position_embeddings=config_int(text, "max_position_embeddings"),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights in memory: every parameter at `dtype_bytes`."""
        return self.num_params * self.dtype_bytes

    @property
    def embedding_params(self) -> int:
        """The input embedding table plus the lm_head when it is a separate matrix."""
        tables = 1 if self.tie_word_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    @property
    def non_embedding_params(self) -> int:
        """Parameters every token goes through as matmuls (Kaplan et al.'s N)."""
        return self.num_params - self.embedding_params

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelGeometry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})
