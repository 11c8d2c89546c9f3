"""The prompt-length sweep of the reference article, on any Engine.

Each run sends `concurrency` requests of an exact-length synthetic prompt that ignore EOS,
so every run generates the same number of tokens. The result (`bench.sweep_result`) uses
`vllm bench`'s field names.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from bench.records import request_record
from bench.step_view import StepTaps
from bench.sweep_result import SweepConfig, SweepMetrics, SweepPoint, SweepResult
from engine.errors import KvscopeError
from engine.events import GenerationRequest, RequestFinished, SamplingSettings
from engine.request_book import check_prompt_length
from engine.stats import summarize_ms
from roofline.point_perf import point_roofline

if TYPE_CHECKING:
    from engine.protocol import Engine

# Predicted floors for a prompt length: (ttft_floor_s, itl_floor_s).
FloorFn = Callable[[int], tuple[float, float]]


def make_floors(model_path: str, hardware: str, output_len: int) -> tuple[FloorFn, dict[str, Any]]:
    """Roofline floors for the running model on `hardware` ("cpu" is this machine)."""
    from roofline.floors import itl_floor_s, ttft_floor_s
    from roofline.hardware import load_geometry, load_profile

    geom = load_geometry(model_path)
    hw = load_profile(hardware, option="--hardware")

    def floors(prompt_len: int) -> tuple[float, float]:
        # ITL floor at the middle of the output, where the median token sits.
        return ttft_floor_s(geom, hw, prompt_len), itl_floor_s(
            geom, hw, prompt_len + output_len // 2
        )

    return floors, {**hw.to_dict(), "model_geometry": geom.to_dict()}


def floors_for_card(card: Any, output_len: int) -> FloorFn | None:
    """This machine's floors for a CPU engine's model, or None where none can be had
    (a GPU, whose profile the user must name; a model whose config is not local)."""
    if card is None or card.device != "cpu":
        return None
    try:
        return make_floors(card.path, "cpu", output_len)[0]
    except KvscopeError:
        return None


_ids = itertools.count()
"""Request IDs, unique within the process: a tape of two sweeps never repeats one."""


def _make_request(
    engine: Engine, prompt_len: int, output_len: int, seed: int, n: int
) -> GenerationRequest:
    # The run's seed and the request's place in the run: every invocation draws fresh
    # prompts (a server's prefix cache cannot serve a second run from the first one's
    # blocks), `--seed` repeats them, and no two prompts of a run share a prefix.
    return GenerationRequest(
        f"bench-{prompt_len}-{next(_ids)}",
        prompt_token_ids=engine.synthetic_prompt(
            prompt_len, seed=(seed * 1_000_003 + prompt_len) * 1_000_033 + n
        ),
        sampling=SamplingSettings(max_tokens=output_len, ignore_eos=True),
    )


async def _one_request(
    engine: Engine, prompt_len: int, output_len: int, seed: int, n: int
) -> RequestFinished:
    return await _send(engine, _make_request(engine, prompt_len, output_len, seed, n))


async def _send_together(
    engine: Engine, requests: list[GenerationRequest]
) -> list[RequestFinished]:
    """Send every request in one go: all prompts are built first, so for --concurrency N
    all N are in the engine's queue before the first step that serves them (building one
    while the engine already steps on another would shorten the first one's TTFT)."""
    return list(await asyncio.gather(*(_send(engine, r) for r in requests)))


async def _send(engine: Engine, request: GenerationRequest) -> RequestFinished:
    finished = None
    async for event in engine.stream(request):
        if isinstance(event, RequestFinished):
            finished = event
    assert finished is not None
    return finished


def _pct(floor_ms: float | None, measured_ms: float) -> float | None:
    return 100 * floor_ms / measured_ms if floor_ms is not None and measured_ms > 0 else None


def summarize(
    prompt_len: int,
    done: list[RequestFinished],
    duration_s: float,
    floors: FloorFn | None,
    taps: StepTaps | None = None,
) -> SweepPoint:
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    itl = [x for r in done for x in r.itl_s]
    tpot = [
        (r.e2e_s - (r.ttft_s or 0.0)) / (r.output_tokens - 1) for r in done if r.output_tokens > 1
    ]
    e2el = [r.e2e_s for r in done]
    total_out = sum(r.output_tokens for r in done)
    ttft_floor = itl_floor = None
    if floors is not None:
        floor_ttft_s, floor_itl_s = floors(prompt_len)
        ttft_floor, itl_floor = floor_ttft_s * 1000, floor_itl_s * 1000
    t, tp, i, e = (
        summarize_ms(k, v)
        for k, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el))
    )
    metrics = SweepMetrics(
        completed=len(done),
        total_output_tokens=total_out,
        mean_ttft_ms=t["mean_ttft_ms"],
        median_ttft_ms=t["median_ttft_ms"],
        p99_ttft_ms=t["p99_ttft_ms"],
        mean_tpot_ms=tp["mean_tpot_ms"],
        median_tpot_ms=tp["median_tpot_ms"],
        p99_tpot_ms=tp["p99_tpot_ms"],
        mean_itl_ms=i["mean_itl_ms"],
        median_itl_ms=i["median_itl_ms"],
        p99_itl_ms=i["p99_itl_ms"],
        mean_e2el_ms=e["mean_e2el_ms"],
        median_e2el_ms=e["median_e2el_ms"],
        p99_e2el_ms=e["p99_e2el_ms"],
        output_throughput=total_out / duration_s if duration_s > 0 else 0.0,
        request_throughput=len(done) / duration_s if duration_s > 0 else 0.0,
        duration_s=duration_s,
        ttft_floor_ms=ttft_floor,
        itl_floor_ms=itl_floor,
        # How close the measurement comes to the floor: 100 % would be the hardware's peak.
        ttft_pct_of_floor=_pct(ttft_floor, t["mean_ttft_ms"]),
        itl_pct_of_floor=_pct(itl_floor, i["median_itl_ms"]),
    )
    requests = tuple(request_record(r) for r in done)
    # The point on the roofline: what the engine counted over this length's runs.
    roofline = point_roofline(taps.steps, taps.scrapes) if taps is not None else None
    return SweepPoint(prompt_len, True, None, metrics, requests, roofline)


async def run_sweep(
    engine: Engine,
    config: SweepConfig,
    on_point: Callable[[SweepPoint], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    floors: FloorFn | None = None,
) -> SweepResult:
    """Measure every prompt length; a length that fails becomes a failed point."""
    config.validate()
    card = engine.card
    result = SweepResult(config, model=asdict(card) if card else None)
    total = config.warmup + len(config.prompt_lens) * config.runs
    done_units = 0

    def tick() -> None:
        nonlocal done_units
        done_units += 1
        if on_progress:
            on_progress(done_units, total)

    if on_progress:
        on_progress(0, total)
    # Warm-up at the shortest length: the first requests of a fresh engine pay one-off costs.
    warm_len = min(config.prompt_lens)
    if card is not None and card.max_model_len:  # 0: a server that does not say
        # vLLM refuses a prompt of max_model_len tokens: one token short of it is the most.
        warm_len = min(warm_len, card.max_model_len - 1)
    made = itertools.count()
    for _ in range(config.warmup):
        await _one_request(engine, warm_len, min(config.output_len, 8), config.seed, next(made))
        tick()
    for index, prompt_len in enumerate(config.prompt_lens):
        finished: list[RequestFinished] = []
        duration = 0.0
        # Attached only while this length runs: its steps (or scrape windows) are its own.
        taps = StepTaps()
        taps.attach(engine)
        try:
            if card is not None:
                # Before the prompt is built: 10^9 synthetic tokens would take GBs first.
                check_prompt_length(prompt_len, card.max_model_len)
            for _ in range(config.runs):
                batch = [
                    _make_request(engine, prompt_len, config.output_len, config.seed, next(made))
                    for _ in range(config.concurrency)
                ]
                start = time.perf_counter()
                finished += await _send_together(engine, batch)
                duration += time.perf_counter() - start
                tick()
            await taps.last_window()
            taps.detach()
            point = summarize(prompt_len, finished, duration, floors, taps)
        except KvscopeError as exc:
            point = SweepPoint(prompt_len, False, exc.plain(), None)
            # Count the runs this length will not make, so progress stays truthful.
            done_units = config.warmup + (index + 1) * config.runs - 1
            tick()
        finally:
            taps.detach()  # also when the sweep is stopped: no listener outlives its point
        result.points.append(point)
        if on_point:
            on_point(point)
    if on_progress:
        on_progress(total, total)
    return result
