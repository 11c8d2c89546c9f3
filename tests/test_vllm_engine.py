"""What only the real engine can show: timing physics, start-up failures, the CLI."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_helpers import KVSCOPE
from session_engine import ENGINE_KV_BYTES, TEST_DTYPE_BYTES

from engine.errors import ModelNotFound, PromptTooLong
from engine.events import GenerationRequest, RequestFinished, SamplingSettings

if TYPE_CHECKING:
    from engine.protocol import Engine
    from engine.vllm.engine import VllmEngine

ROOT = Path(__file__).resolve().parents[1]


async def _ttft(engine: Engine, n: int, seed: int) -> float:
    last = None
    async for event in engine.stream(
        GenerationRequest(
            f"ttft-{n}-{seed}",
            prompt_token_ids=engine.synthetic_prompt(n, seed=seed),
            sampling=SamplingSettings(max_tokens=2, ignore_eos=True),
        )
    ):
        last = event
    assert isinstance(last, RequestFinished)
    assert last.ttft_s is not None
    return last.ttft_s


async def test_ttft_grows_with_the_prompt(vllm_engine: Engine) -> None:
    await _ttft(vllm_engine, 64, seed=100)  # warm-up: the first request of an engine is slow
    short = min([await _ttft(vllm_engine, 64, seed=s) for s in (101, 102)])
    # One long run is enough: noise only makes it longer, which the check allows.
    long = await _ttft(vllm_engine, 1024, seed=103)
    # Prefill of 16x the tokens: measured 8-20x on 2-core CPUs; 3x leaves room for noise.
    assert long > 3 * short, (short, long)


async def test_vllm_refusal_maps_to_prompt_too_long(vllm_engine: VllmEngine) -> None:
    """Our own pre-check is lifted, so the refusal must come from vLLM's validation."""
    card = vllm_engine.card
    assert card is not None
    n = card.max_model_len + 10
    ids = vllm_engine.synthetic_prompt(n)
    vllm_engine._card = dataclasses.replace(card, max_model_len=n + 1)
    try:
        with pytest.raises(PromptTooLong) as info:
            async for _ in vllm_engine.stream(
                GenerationRequest(
                    "refused", prompt_token_ids=ids, sampling=SamplingSettings(max_tokens=4)
                )
            ):
                pass
    finally:
        vllm_engine._card = card
    assert info.value.prompt_tokens == n
    assert info.value.max_model_len == card.max_model_len  # read from vLLM's message


@pytest.mark.engine
def test_bad_model_path_is_model_not_found() -> None:
    from engine.vllm.engine import VllmEngine

    engine = VllmEngine(argv=["--model", "/nonexistent/kvscope-model"])
    with pytest.raises(ModelNotFound) as info:
        engine.start()
    assert info.value.path_or_id == "/nonexistent/kvscope-model"
    assert "/nonexistent/kvscope-model" in info.value.plain()


# The start-up refusal of a KV pool too small for one request, with its figures, and the
# JSON of a whole `generate` run are checked on the CLI's own runs in test_bad_input.py
# (`test_start_up_failures_say_why_with_numbers`, `test_a_prompt_that_is_not_utf8_...`):
# one engine start each there, none more here.


def test_generate_cli_says_a_prompt_too_long_in_one_line() -> None:
    # Refused before vLLM is imported: kvscope checks the length against --max-model-len.
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    bad = subprocess.run(
        [
            KVSCOPE,
            "generate",
            "--prompt-tokens",
            "5000",
            "--max-tokens",
            "4",
            "--max-model-len",
            "2048",
            "--kv-cache-memory-bytes",
            str(64 * 1024**2),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert "kvscope: Prompt too long: 5,000 tokens" in bad.stderr
    assert "2,048" in bad.stderr


@pytest.mark.engine
def test_bad_model_cli_is_one_plain_line() -> None:
    out = subprocess.run(
        [KVSCOPE, "generate", "--prompt", "hi", "--model", "./no/such/model"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "kvscope: Model not found: './no/such/model'" in out.stderr


def test_vllm_internals_are_where_kvscope_expects(vllm_engine: VllmEngine) -> None:
    """If this fails after a vLLM upgrade, fix engine/vllm/internals.py and only it."""
    intro = vllm_engine.introspection
    assert vllm_engine.card is not None
    assert intro.total_blocks == vllm_engine.card.total_blocks
    bs = vllm_engine.card.block_size  # 128 on the CPU backend, the attention backend's on CUDA
    assert intro.block_size == bs
    assert 0 <= intro.free_blocks() <= intro.total_blocks
    assert hasattr(intro.scheduler, "requests")
    assert hasattr(intro.scheduler, "running")
    assert callable(intro.kv_manager.get_block_ids)
    # 256 MiB / (46,080 B/token x 128 tokens/block) = 45 blocks on the CPU, one of them
    # vLLM's null block. SmolLM2's KV: K and V x 30 layers x 3 heads x 64 x the dtype's bytes.
    per_token = 2 * 30 * 3 * 64 * TEST_DTYPE_BYTES
    assert intro.total_blocks == math.floor(ENGINE_KV_BYTES / (per_token * bs)) - 1
