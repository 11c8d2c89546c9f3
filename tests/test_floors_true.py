"""The roofline's floors are floors: on the real engine, on this machine, nothing measured
beats them.

A floor divides work by the machine's peak rates, so the peaks must be the most this
machine can do on any path the engine may take. The first calibration timed a bf16
matmul only, which on a CPU without bf16 units runs a slow path (0.3 GFLOP/s where vLLM's
own prefill ran at 20): every "floor" was then far above the measurement. These tests
hold the calibration to the machine (its peak at least the float32 rate measured here and
now) and the floors to the engine (measured TTFT and every ITL at or above their floors).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bench.sweep_result import SweepMetrics, SweepPoint
from engine.events import GenerationRequest, RequestFinished, SamplingSettings
from engine.fake import FakeEngine
from roofline.cpu_calibration import calibrate_cpu
from roofline.floors import (
    FLOOR_BEATEN,
    floor_beaten,
    floor_share_words,
    itl_floor_s,
    percent_of_floor,
    prefill_flops,
    ttft_floor_s,
)
from roofline.hardware import load_geometry
from tui.screens.estimates import estimate
from tui.sweep.prompt_view_model import floor_cell

if TYPE_CHECKING:
    from engine.protocol import Engine

# Tiny prompts (a real-engine test's budget), and enough output for a few ITLs each.
PROMPT_LENS = (16, 64)
OUTPUT_TOKENS = 8


def _float32_rate(n: int = 512, reps: int = 3) -> float:
    """A plain float32 matmul's FLOP/s, timed here: a rate the machine surely reaches."""
    import torch

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def test_calibration_is_quick_says_what_it_does_and_reaches_the_float32_rate() -> None:
    import torch  # noqa: F401  (imported before the clock starts: vLLM's process has it)

    said: list[str] = []
    budget_s = 1.0
    start = time.perf_counter()
    profile = calibrate_cpu(budget_s, write_cache=False, progress=said.append)
    took = time.perf_counter() - start
    print(f"\ncalibrated in {took:.1f} s: {profile.notes}")
    # The budget is the calibration's own promise: about twice it on an idle 2-core
    # machine. Fifteen times it leaves room for a host loaded 4x over and still fails
    # the calibration that took minutes on a slow bf16 path, on any CPU.
    assert took < 15 * budget_s, f"calibration took {took:.1f} s for a {budget_s:g} s budget"
    assert any("bandwidth" in s for s in said)
    assert any("matmul" in s for s in said)
    # A bf16-only calibration on a CPU without bf16 units reads 1/100 of this rate. Half
    # of it leaves room for a busy host during either measurement.
    assert profile.peak_bf16_flops >= 0.5 * _float32_rate(), profile.notes


def test_a_share_above_100_percent_is_shown_as_a_bug() -> None:
    assert floor_share_words(percent_of_floor(0.100, 0.051)) == "51%"
    assert floor_share_words(None) == "-"
    beaten = percent_of_floor(0.100, 0.879)
    assert floor_beaten(beaten)
    assert floor_share_words(beaten) == FLOOR_BEATEN
    assert "%" not in floor_share_words(beaten, short=True)
    assert not floor_beaten(100.0)


def test_the_sweep_screen_shows_a_beaten_floor_as_a_bug() -> None:
    beaten = SweepPoint(512, True, None, SweepMetrics(ttft_pct_of_floor=879.0))
    fine = SweepPoint(512, True, None, SweepMetrics(ttft_pct_of_floor=43.2))
    assert floor_cell(beaten, "ttft_pct_of_floor") == "beaten ✗"
    assert floor_cell(fine, "ttft_pct_of_floor") == "43%"
    assert floor_cell(fine, "itl_pct_of_floor") == "–"


async def _run(engine: Engine, rid: str, n: int, seed: int) -> RequestFinished:
    request = GenerationRequest(
        rid,
        prompt_token_ids=engine.synthetic_prompt(n, seed=seed),
        sampling=SamplingSettings(max_tokens=OUTPUT_TOKENS, ignore_eos=True),
    )
    last = None
    async for event in engine.stream(request):
        last = event
    assert isinstance(last, RequestFinished)
    return last


async def test_measured_ttft_and_itl_never_beat_their_floors(vllm_engine: Engine) -> None:
    card = vllm_engine.card
    assert card is not None
    geometry = load_geometry(card.path)
    await _run(vllm_engine, "floors-warm", 16, seed=900)  # one-off costs of a fresh engine
    # Calibrated after the engine is up and warm, as `kvscope bench` does, and never from
    # the user's cache: this checks the measuring, not whatever was measured before.
    hw = calibrate_cpu(1.0, write_cache=False)
    print(f"\n{hw.notes}")
    for i, n in enumerate(PROMPT_LENS):
        done = await _run(vllm_engine, f"floors-{n}", n, seed=901 + i)
        assert done.ttft_s is not None
        floor = ttft_floor_s(geometry, hw, n)
        rate = prefill_flops(geometry, n) / done.ttft_s / 1e9
        print(
            f"\n{n} tokens: TTFT {done.ttft_s * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms "
            f"(prefill {rate:.1f} GFLOP/s against a peak of {hw.peak_bf16_flops / 1e9:.1f})"
        )
        assert done.ttft_s >= floor, (n, done.ttft_s, floor, hw.notes)
        assert len(done.itl_s) == OUTPUT_TOKENS - 1
        for k, itl in enumerate(done.itl_s):
            # Token k + 1 is decoded with the prompt and k + 1 tokens in the KV cache.
            itl_floor = itl_floor_s(geometry, hw, n + k + 1)
            assert itl >= itl_floor, (n, k, itl, itl_floor, hw.notes)
        print(
            f"{n} tokens: min ITL {min(done.itl_s) * 1e3:.1f} ms, "
            f"floor {itl_floor_s(geometry, hw, n + 1) * 1e3:.2f} ms"
        )


def test_a_send_estimate_says_what_it_rests_on() -> None:
    card = FakeEngine().start()
    steps = [(512, 8.0), (1024, 16.0)]  # 64 tokens/s and no fixed cost
    measured = estimate(card, 1024, 2, measured=steps, floor=lambda n: n / 5000)
    assert measured is not None and measured.source == "measured"
    assert "≈ 32 s" in measured.words()
    assert "64 tokens/s, fitted to 2 prefill steps this session" in measured.words()
    floor = estimate(card, 1024, 2, measured=(), floor=lambda n: n / 5000)
    assert floor is not None and floor.source == "roofline"
    assert "≥" in floor.words()
    assert "the roofline floor, 5,000 tokens/s: no prefill measured yet" in floor.words()
