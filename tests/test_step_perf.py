"""Each step's FLOPs and bytes, as vLLM counts them (`--enable-mfu-metrics`, which kvscope
turns on) and as kvscope's roofline model does, on the real engine (issue #32).

The roofline's claims, held to the counts: a long prompt's prefill steps do more FLOPs per
byte moved than the decode steps of the same request; a decode step of a bigger batch does
more FLOPs per byte than one of a single request (the batch shares the weight reads).
"""

from __future__ import annotations

import asyncio
import statistics
from typing import TYPE_CHECKING

import pytest
from engine_hooks import SCHEDULING_MODES, scheduling
from test_truth import _run

from engine.events import GenerationRequest, SamplingSettings, StepSample
from roofline.floors import decode_flops_per_token, prefill_flops
from roofline.hardware import load_geometry
from roofline.step_perf import RESIDUAL_TOLERANCE, RequestSlice, StepModel, perf_check

if TYPE_CHECKING:
    from engine.protocol import Engine
    from engine.vllm.engine import VllmEngine

PROMPT = 512
OUTPUT = 16


async def _steps_of(
    engine: Engine, runs: dict[str, tuple[int, int]], seed: int
) -> list[StepSample]:
    """Run every request of `runs` (id: prompt tokens, output tokens) at once; the steps
    that did work for any of them."""
    samples: list[StepSample] = []

    def on_step(sample: StepSample) -> None:
        if not sample.idle and any(w.request_id in runs for w in sample.work):
            samples.append(sample)

    remove = engine.add_step_listener(on_step)
    try:
        await asyncio.gather(
            *(_run(engine, rid, n, m, seed + i) for i, (rid, (n, m)) in enumerate(runs.items()))
        )
    finally:
        remove()
    return samples


def _intensity(sample: StepSample) -> float:
    assert sample.perf is not None, f"step {sample.step} has no count from vLLM"
    value = sample.perf.intensity
    assert value is not None, f"step {sample.step}: vLLM counted no byte moved"
    return value


def test_kvscope_turns_vllms_count_on_unless_told_not_to() -> None:
    from engine.vllm.options import build_engine_settings

    assert build_engine_settings([], prepare=False).engine_args.enable_mfu_metrics is True
    off = build_engine_settings(["--no-enable-mfu-metrics"], prepare=False)
    assert off.engine_args.enable_mfu_metrics is False


async def test_every_step_of_a_long_request_has_vllms_count(vllm_engine: Engine) -> None:
    steps = await _steps_of(vllm_engine, {"perf-long": (PROMPT, OUTPUT)}, seed=3200)
    # The prompt, then one step per output token after the first.
    assert sum(s.prefill_tokens for s in steps) == PROMPT
    assert sum(s.decode_tokens for s in steps) == OUTPUT - 1
    for s in steps:
        assert s.perf is not None, f"step {s.step} has no count from vLLM"
        assert s.perf.source == "vllm"
        assert s.perf.flops > 0 and s.perf.read_bytes > 0 and s.perf.write_bytes > 0


async def test_prefill_steps_do_more_per_byte_than_decode_steps(vllm_engine: Engine) -> None:
    steps = await _steps_of(vllm_engine, {"perf-kinds": (PROMPT, OUTPUT)}, seed=3210)
    prefill = [_intensity(s) for s in steps if s.prefill_tokens and not s.decode_tokens]
    decode = [_intensity(s) for s in steps if s.decode_tokens and not s.prefill_tokens]
    assert prefill and decode, [(s.prefill_tokens, s.decode_tokens) for s in steps]
    assert min(prefill) > max(decode), (prefill, decode)


async def test_decode_does_more_per_byte_in_a_bigger_batch(vllm_engine: Engine) -> None:
    alone = await _steps_of(vllm_engine, {"perf-b1": (64, 8)}, seed=3220)
    four = {f"perf-b4-{i}": (64, 8) for i in range(4)}
    together = await _steps_of(vllm_engine, four, seed=3230)
    one = [_intensity(s) for s in alone if s.decode_tokens == 1 and not s.prefill_tokens]
    batch = [_intensity(s) for s in together if s.decode_tokens == 4 and not s.prefill_tokens]
    assert one and batch, [(s.prefill_tokens, s.decode_tokens) for s in together]
    assert statistics.median(batch) > statistics.median(one), (one, batch)


@pytest.mark.parametrize("key", ["qwen2.5-7b", "llama-3.1-8b"])
def test_kvscopes_step_count_is_the_floors_count(key: str) -> None:
    """A whole prompt in one step is `prefill_flops`; one decode token is
    `decode_flops_per_token`; a batch of b decodes reads the weights once and b KVs."""
    geom = load_geometry(key)
    model = StepModel(geom)
    assert model.count([RequestSlice(PROMPT, PROMPT)]).perf.flops == prefill_flops(geom, PROMPT)
    one = model.count([RequestSlice(1, PROMPT)]).perf
    assert one.flops == decode_flops_per_token(geom, PROMPT)
    four = model.count([RequestSlice(1, PROMPT)] * 4).perf
    assert four.flops == 4 * one.flops
    kv = geom.kv_bytes_per_token * PROMPT
    assert four.read_bytes - one.read_bytes == 3 * kv
    # The same prompt in two chunks: the causal pairs add up to the whole prompt's, and
    # each chunk makes one request's logits (vLLM computes them for a partial prompt too).
    half = PROMPT // 2
    chunks = [model.count([RequestSlice(half, c)]).perf.flops for c in (half, PROMPT)]
    assert sum(chunks) == prefill_flops(geom, PROMPT) + 2 * geom.vocab_size * geom.hidden_size


@pytest.mark.parametrize("mode", SCHEDULING_MODES)
async def test_vllms_count_is_kvscopes_plus_the_named_differences(
    vllm_engine: VllmEngine, mode: str
) -> None:
    """Every step's count from vLLM is that step's: with a batch in flight (async
    scheduling, a batch queue) too, where a step hands out the batch before the one the
    scheduler just made (a count from the wrong batch is a prompt's in a decode step)."""
    card = vllm_engine.card
    assert card is not None
    model = StepModel.for_card(load_geometry(card.path), card)
    with scheduling(vllm_engine, mode):
        steps = await _steps_of(vllm_engine, {f"perf-agree-{mode}": (PROMPT, OUTPUT)}, seed=3240)
    for s in steps:
        modelled = model.observe(s)
        assert s.perf is not None and modelled is not None
        check = perf_check(s.perf, modelled)
        assert check.agree, (s.step, s.prefill_tokens, s.decode_tokens, check)
        if not s.prefill_tokens:
            # A decode step: the same FLOPs and reads without any named difference (the
            # activations of one token are far under the tolerance of the weights).
            assert not any(d.startswith(("flops", "read")) for d in check.differences), check
            assert s.perf.flops == pytest.approx(modelled.perf.flops, rel=RESIDUAL_TOLERANCE)


async def test_generate_json_gives_both_counts_for_every_step(vllm_engine: Engine) -> None:
    """What `kvscope generate --prompt-tokens 512 --max-tokens 16 --json` prints."""
    from cli.generate import generate_once

    # Its own prompt (generate's is the default seed's, which other tests of this session
    # send too): none of it is in the prefix cache, so every token is prefilled here.
    request = GenerationRequest(
        "generate",
        prompt_token_ids=vllm_engine.synthetic_prompt(PROMPT, seed=5151),
        sampling=SamplingSettings(max_tokens=OUTPUT, ignore_eos=True),
    )
    result = await generate_once(vllm_engine, request)
    steps = result["steps"]
    assert sum(s["prefill_tokens"] for s in steps) == PROMPT
    for s in steps:
        assert s["perf"]["source"] == "vllm" and s["perf_model"]["source"] == "kvscope"
        assert s["perf_check"]["agree"], s["perf_check"]
    summary = result["step_perf"]
    assert summary["tolerance"] == RESIDUAL_TOLERANCE
    assert summary["steps_agree"] == summary["steps_compared"] == len(steps)
    # The prompt's step names what vLLM counts beyond kvscope: its activations written.
    prefill = next(s for s in steps if s["prefill_tokens"])
    assert any(d.startswith("write bytes") for d in prefill["perf_check"]["differences"])


def _with_estimates(text: str, flops: float, read: float, write: float) -> str:
    model = 'engine="0",model_name="/root/.cache/kvscope/models/SmolLM2-135M-Instruct"'
    lines = []
    for name, value in (("flops", flops), ("read_bytes", read), ("write_bytes", write)):
        metric = f"vllm:estimated_{name}_per_gpu"
        lines += [f"# TYPE {metric} counter", f"{metric}_total{{{model}}} {value}"]
    return text + "\n".join(lines) + "\n"


def test_a_servers_estimated_counters_give_each_scrape_window_its_work() -> None:
    from pathlib import Path

    from engine.remote.metrics import ScrapeState, cache_info, parse_metrics, step_sample

    busy = (Path(__file__).parent / "fixtures" / "remote" / "metrics_busy.txt").read_text()
    state = ScrapeState()
    first = parse_metrics(_with_estimates(busy, 1e9, 5e8, 1e7))
    assert state.update(first, 1.0, cache_info(first)).perf is None  # no window yet
    second = parse_metrics(_with_estimates(busy, 4e9, 8e8, 3e7))
    window = state.update(second, 2.0, cache_info(second))
    assert window.perf is not None
    assert (window.perf.flops, window.perf.read_bytes, window.perf.write_bytes) == (3e9, 3e8, 2e7)
    assert window.perf.source == "vllm counters"
    assert step_sample(window).perf == window.perf
    # A server without --enable-mfu-metrics exports them at zero, or not at all: no
    # count, not a window of zero work.
    for text in (busy, _with_estimates(busy, 0, 0, 0)):
        plain = ScrapeState()
        for at in (1.0, 2.0):
            parsed = parse_metrics(text)
            assert plain.update(parsed, at, cache_info(parsed)).perf is None


def test_a_model_split_over_devices_is_not_compared() -> None:
    """vLLM counts per GPU of TP x PP; kvscope's model is the whole model's."""
    import dataclasses

    from cli.generate import _step_model
    from engine.fake import FakeEngine

    fake = FakeEngine()
    card = fake.start()
    fake.shutdown()
    split = dataclasses.replace(card, path="smollm2-135m-instruct", parallel="TP 2 x PP 1 x DP 1")
    model, why = _step_model(split)
    assert model is None and "per GPU of TP 2 x PP 1 x DP 1" in why
    alone, none = _step_model(dataclasses.replace(split, parallel=""))
    assert alone is not None and none == ""


def test_a_request_that_ends_in_its_step_keeps_its_context() -> None:
    """It is gone from the step's blocks: its context is the last one seen, plus the step's
    tokens (the KV its last decode read)."""
    from engine.events import RequestBlocks, RequestWork

    geom = load_geometry("llama-3.1-8b")
    model = StepModel(geom)

    def step(n: int, prefill: int, decode: int, held: int | None) -> StepSample:
        blocks = (RequestBlocks("r", (0,), held),) if held is not None else ()
        return StepSample(
            step=n, started_at=0.0, duration_s=0.1, prefill_tokens=prefill,
            decode_tokens=decode, running=1, waiting=0, kv_usage=0.5, free_blocks=1,
            total_blocks=2, block_size=16, blocks=blocks,
            work=(RequestWork("r", prefill, decode),),
        )  # fmt: skip

    first = model.observe(step(1, PROMPT, 0, PROMPT))
    assert first is not None and first.perf.flops == prefill_flops(geom, PROMPT)
    last = model.observe(step(2, 0, 1, None))
    assert last is not None
    assert last.perf.flops == decode_flops_per_token(geom, PROMPT + 1)
    assert last.vllm_only.flops == 0  # one query: no pair past the causal ones
