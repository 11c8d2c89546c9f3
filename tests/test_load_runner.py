"""The load runner on the fake engine: closed and open loops, planned vs actual sends, the
step view, goodput in the result, and an over-saturated point stopped early, all on a
simulated clock (deterministic, and no test waits for real time)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
from dataclasses import replace

import pytest

from bench.load_result import LoadConfig, LoadResult
from bench.load_runner import LoadLevel, LoadRunner, LoadTick, run_load, validate
from engine.errors import BadOption
from engine.fake import FakeConfig, FakeEngine


class SimClock:
    """Discrete-event time: a sleeper wakes when every other task has run as far as it
    can, and the clock jumps to the earliest wake-up. The fake engine and the runner then
    share one consistent timeline, as with real time, but no test waits."""

    def __init__(self) -> None:
        self._t = 0.0
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._driver: asyncio.Task[None] | None = None

    def now(self) -> float:
        return self._t

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._heap, (self._t + max(0.0, seconds), next(self._seq), fut))
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        await fut

    async def _drive(self) -> None:
        while self._heap:
            for _ in range(50):  # let every runnable task run to its next wait
                await asyncio.sleep(0)
            at, _, fut = heapq.heappop(self._heap)
            self._t = max(self._t, at)
            if not fut.done():
                fut.set_result(None)


def fake(clock: SimClock, **kw: object) -> FakeEngine:
    config = FakeConfig(
        total_blocks=kw.pop("total_blocks", 256),  # type: ignore[arg-type]
        max_num_batched_tokens=kw.pop("budget", 512),  # type: ignore[arg-type]
        decode_step_s=0.02,
        **kw,  # type: ignore[arg-type]
    )
    engine = FakeEngine(config, clock=clock)
    engine.start()
    return engine


def config(**kw: object) -> LoadConfig:
    base: dict[str, object] = {
        "mode": "concurrency",
        "levels": (1,),
        "prompt_len": 64,
        "output_len": 16,
        "warmup": 0,
        "seed": 7,
    }
    base.update(kw)
    return LoadConfig(**base)  # type: ignore[arg-type]


async def test_closed_loop_batches_users_and_raises_throughput() -> None:
    clock = SimClock()
    engine = fake(clock)
    ticks: list[LoadTick] = []
    result = await run_load(
        engine,
        config(levels=(1, 4), num_prompts=8, goodput={"ttft": 1000.0}),
        on_progress=ticks.append,
    )
    one, four = result.points
    assert (one.completed, four.completed) == (8, 8)
    assert (one.max_concurrency, four.max_concurrency) == (1, 4)
    assert one.max_concurrent_requests == 1 and four.max_concurrent_requests == 4
    # The fake's decode step costs the same for 1 or 4 requests: throughput scales.
    assert four.output_throughput > 3 * one.output_throughput
    assert four.steps is not None and four.steps.max_running == 4
    assert one.steps is not None and one.steps.max_running == 1
    assert one.request_goodput == pytest.approx(8 / one.duration_s)
    assert one.slo_ttft_within == 1.0
    assert one.schedule_error_p50_ms is None  # a closed loop plans no send times
    assert all("user" in r for r in four.requests)
    assert ticks[-1].point == 2 and ticks[-1].done == 8


async def test_open_loop_keeps_planned_and_actual_send_times() -> None:
    clock = SimClock()
    engine = fake(clock)
    result = await run_load(
        engine, config(mode="rate", levels=(5.0,), num_prompts=10, arrival="constant")
    )
    (point,) = result.points
    assert point.completed == 10 and point.request_rate == 5.0
    planned = [r["planned_s"] for r in point.requests]
    assert sorted(planned) == pytest.approx([0.2 * (i + 1) for i in range(10)])
    # On a simulated clock the sender is never late.
    assert point.schedule_error_p99_ms == pytest.approx(0.0, abs=1e-6)
    assert point.stopped_early is None
    data = json.loads(result.to_json())
    assert data["seed"] == 7 and data["points"][0]["request_rate"] == 5.0
    assert "schedule_error_p99_ms" in result.to_csv().splitlines()[0]


async def test_rate_inf_sends_all_at_once_and_says_who_queued() -> None:
    clock = SimClock()
    # A token budget of 128: two 64-token prompts per step, the rest wait.
    engine = fake(clock, budget=128)
    result = await run_load(engine, config(mode="rate", levels=(math.inf,), num_prompts=8))
    (point,) = result.points
    assert point.completed == 8
    assert {r["planned_s"] for r in point.requests} == {0.0}
    assert point.queued_requests == 6
    assert point.steps is not None and point.steps.max_waiting == 6
    assert any("6 of 8 requests waited" in n for n in point.notes)
    assert json.loads(result.to_json())["points"][0]["request_rate"] == "inf"


async def test_an_over_saturated_point_stops_early_and_says_why() -> None:
    clock = SimClock()
    # About 50 tokens/s of decode for 16-token replies: ~3 requests/s at most; ask 40/s.
    engine = fake(clock, budget=64, max_model_len=2048)
    cfg = config(mode="rate", levels=(40.0,), num_prompts=400, arrival="constant")
    result = await run_load(engine, cfg)
    (point,) = result.points
    assert point.stopped_early is not None
    assert point.stopped_early.startswith("over-saturated")
    assert point.completed + point.aborted + point.failed < 400
    assert point.aborted > 0
    assert any(n.startswith("stopped early") for n in point.notes)
    # The same load at a rate the engine keeps up with runs to its end.
    calm = await LoadRunner(engine, replace(cfg, num_prompts=20)).measure(LoadLevel.per_second(2))
    assert calm.stopped_early is None and calm.completed == 20


async def test_duration_mode_and_a_fresh_prompt_per_request() -> None:
    clock = SimClock()
    engine = fake(clock)
    result = await run_load(
        engine, config(levels=(2,), duration_s=3.0, range_ratio=0.5, shared_prefix=0)
    )
    (point,) = result.points
    assert point.completed >= 4
    lens = {r["prompt_tokens"] for r in point.requests}
    assert len(lens) > 1 and all(32 <= n <= 96 for n in lens)


async def test_a_prompt_past_the_context_fails_the_point_alone() -> None:
    clock = SimClock()
    engine = fake(clock, max_model_len=128)
    result = await run_load(engine, config(prompt_len=200, levels=(1,), num_prompts=2))
    assert not result.points[0].ok
    assert "200" in (result.points[0].error or "")


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"levels": (100_000_000,)}, "--concurrency"),
        ({"mode": "rate", "levels": (-1.0,)}, "--request-rate"),
        ({"mode": "rate", "levels": (1e9,)}, "--request-rate"),
        ({"duration_s": 1e9}, "--duration"),
        ({"range_ratio": 1.5}, "--range-ratio"),
        ({"shared_prefix": 64}, "--shared-prefix"),
        ({"burstiness": 0.0}, "--burstiness"),
    ],
)
def test_absurd_bounds_are_refused_before_any_work(kw: dict[str, object], option: str) -> None:
    with pytest.raises(BadOption) as info:
        validate(config(**kw))
    assert info.value.option == option


def test_an_empty_result_still_writes() -> None:
    assert LoadResult(config()).to_csv().startswith("profile,")
