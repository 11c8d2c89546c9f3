"""The one reader of a model's attention geometry and parameter count: a config.json dict
and a config object (as transformers and vLLM load it) read the same, and the roofline
agrees with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.errors import BadOption
from engine.model_geometry import config_fields, count_parameters, read_attention_geometry
from roofline.hardware import known_models, load_geometry

ROOT = Path(__file__).resolve().parents[1]
SMOL = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
}


class _AliasedConfig:
    """A config object whose layer count answers only to an alias, as transformers'
    `attribute_map` makes GPT-2's `n_layer` answer to `num_hidden_layers`."""

    def __init__(self, **values: object) -> None:
        self.n_layer = values.pop("num_hidden_layers")
        for key, value in values.items():
            setattr(self, key, value)

    @property
    def num_hidden_layers(self) -> object:
        return self.n_layer


def test_a_config_object_reads_as_its_config_json() -> None:
    from_dict = read_attention_geometry(SMOL)
    from_object = read_attention_geometry(config_fields(_AliasedConfig(**SMOL)))
    assert from_object == from_dict
    assert from_dict.num_layers == 30
    assert from_dict.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2 == 23_040


def test_left_out_sizes_take_the_models_defaults() -> None:
    plain = {k: v for k, v in SMOL.items() if k != "num_key_value_heads"}
    geometry = read_attention_geometry(plain)
    assert geometry.num_kv_heads == 9  # no grouped-query attention: one KV head per head
    assert geometry.head_dim == 576 // 9
    assert read_attention_geometry({**SMOL, "head_dim": None}).head_dim == 64
    assert read_attention_geometry({**SMOL, "head_dim": 128}).head_dim == 128
    unbounded = {k: v for k, v in SMOL.items() if k != "max_position_embeddings"}
    assert read_attention_geometry(unbounded).max_position_embeddings is None


def test_a_nested_text_config_is_read() -> None:
    assert read_attention_geometry({"text_config": SMOL}) == read_attention_geometry(SMOL)


def test_a_missing_size_is_named() -> None:
    broken = {k: v for k, v in SMOL.items() if k != "num_hidden_layers"}
    with pytest.raises(BadOption, match="num_hidden_layers"):
        read_attention_geometry(broken)


@pytest.mark.parametrize("name", known_models())
def test_the_roofline_reads_the_same_geometry(name: str) -> None:
    geometry = load_geometry(name)
    attention = read_attention_geometry(geometry_config(name))
    assert (geometry.num_layers, geometry.num_kv_heads, geometry.head_dim) == (
        attention.num_layers,
        attention.num_kv_heads,
        attention.head_dim,
    )
    assert geometry.kv_bytes_per_token == attention.kv_bytes_per_token(geometry.dtype_bytes)


def test_the_parameter_count_matches_the_real_model() -> None:
    # 134,515,008: the number of values in SmolLM2-135M-Instruct's model.safetensors (272
    # tensors, no lm_head: it is tied to the embeddings).
    smol = {**SMOL, "tie_word_embeddings": True}
    assert count_parameters(smol) == 134_515_008
    assert count_parameters(config_fields(_AliasedConfig(**smol))) == 134_515_008
    # An untied lm_head is a second vocab x hidden matrix.
    untied = {**smol, "tie_word_embeddings": False}
    assert count_parameters(untied) - count_parameters(smol) == 49152 * 576
    assert count_parameters({"text_config": smol}) == 134_515_008


def test_the_parameter_count_refuses_what_it_cannot_describe() -> None:
    with pytest.raises(BadOption, match="mixture-of-experts"):
        count_parameters({**SMOL, "num_local_experts": 8})
    with pytest.raises(BadOption, match="intermediate_size"):
        count_parameters({k: v for k, v in SMOL.items() if k != "intermediate_size"})


def geometry_config(name: str) -> dict[str, Any]:
    shipped = json.loads((ROOT / "roofline" / "data" / "models.json").read_text("utf-8"))
    config: dict[str, Any] = shipped["models"][name]["config"]
    return config
