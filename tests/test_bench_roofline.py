"""Bench points on the roofline (#32): the arithmetic on known numbers, a real in-process
sweep under this machine's roofs, and `roofline --plot` on a file it cannot draw."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_helpers import KVSCOPE

from bench.sweep import run_sweep
from bench.sweep_result import SweepConfig, SweepResult
from engine.events import StepPerf, StepSample
from engine.remote.vllm_metrics import MFU_FLAG
from roofline.point_perf import (
    PointPerf,
    PointRoofs,
    point_roofline,
    roof_share,
    steps_perf,
    windows_perf,
)

if TYPE_CHECKING:
    from engine.events import ScrapeSample
    from engine.protocol import Engine

FIXTURES = Path(__file__).parent / "fixtures" / "remote"
ROOFS = PointRoofs("test machine", peak_flops=1e12, bandwidth=1e10)  # ridge: 100 FLOP/byte


def _perf(flops: float, moved: float, seconds: float) -> PointPerf:
    return PointPerf(flops, moved, 0.0, seconds, 1, 1, "steps", "vllm")


def _step(n: int, prefill: int, decode: int, perf: StepPerf | None, duration: float) -> StepSample:
    return StepSample(n, float(n), duration, prefill, decode, 1, 0, 0.1, 90, 100, 16, perf=perf)


def test_the_binding_roof_is_the_lower_one_at_the_points_intensity() -> None:
    # 10 FLOP/byte, left of the ridge: the slope binds, at 10 GB/s x 10 = 100 GFLOP/s.
    left = roof_share(_perf(1e9, 1e8, 0.02), ROOFS)  # 50 GFLOP/s
    assert left is not None
    assert left.binding == "bandwidth"
    assert left.roof_flops_per_s == pytest.approx(1e11)
    assert left.share == pytest.approx(0.5)
    assert not left.above
    # 1000 FLOP/byte, right of it: the flat roof, 1 TFLOP/s.
    right = roof_share(_perf(1e12, 1e9, 4.0), ROOFS)  # 250 GFLOP/s
    assert right is not None
    assert right.binding == "compute"
    assert right.roof_flops_per_s == pytest.approx(1e12)
    assert right.share == pytest.approx(0.25)
    assert "25 % of the compute roof" in right.words()


def test_a_point_above_its_roof_is_a_calibration_problem_not_a_share() -> None:
    perf = _perf(2e9, 2e8, 0.01)  # 200 GFLOP/s at 10 FLOP/byte, twice the slope's 100
    share = roof_share(perf, ROOFS)
    assert share is not None and share.above
    assert "calibration problem" in share.words() and "%" not in share.words()
    record = point_roofline([_step(1, 0, 1, StepPerf(2e9, 2e8, 0.0, "vllm"), 0.01)]).to_dict(ROOFS)
    assert record["above_roof"] is True
    assert record["share_of_roof"] is None
    assert "calibration problem" in record["problem"]


def test_a_points_intensity_is_its_flops_over_its_bytes_not_a_mean_of_its_steps() -> None:
    steps = [
        _step(1, 512, 0, StepPerf(1e12, 1e9, 1e7, "vllm"), 0.5),  # ~990 FLOP/byte
        _step(2, 0, 1, StepPerf(2e9, 2e9, 0.0, "vllm"), 0.1),  # 1 FLOP/byte
        _step(3, 0, 1, None, 0.1),  # not counted: neither its work nor its time
    ]
    whole = steps_perf(steps)
    assert whole is not None
    assert (whole.counted, whole.of) == (2, 3)
    assert whole.intensity == pytest.approx((1e12 + 2e9) / (1e9 + 1e7 + 2e9))
    assert whole.flops_per_s == pytest.approx((1e12 + 2e9) / 0.6)
    assert whole.bytes_per_s == pytest.approx((1e9 + 1e7 + 2e9) / 0.6)
    split = dict(point_roofline(steps).by_kind)
    assert split["prefill"].intensity == pytest.approx(1e12 / 1.01e9)
    assert split["decode"].intensity == pytest.approx(1.0)


def _scrapes() -> list[ScrapeSample]:
    from engine.remote.metrics import ScrapeState, cache_info, parse_metrics

    text = (FIXTURES / "metrics_busy.txt").read_text()
    parsed = parse_metrics(text)
    info = cache_info(parsed)
    assert info is not None
    state = ScrapeState()
    return [state.update(parsed, 100.0 + i, info) for i in range(3)]


def test_attached_a_point_sums_its_windows_or_says_which_flag_counts_them() -> None:
    first, second, third = _scrapes()
    counted = [
        dataclasses.replace(second, perf=StepPerf(3e9, 1e9, 0.0, "vllm counters"), interval_s=0.2),
        dataclasses.replace(third, perf=StepPerf(1e9, 1e9, 0.0, "vllm counters"), interval_s=0.3),
    ]
    whole = windows_perf([first, *counted])
    assert whole is not None
    assert (whole.unit, whole.counted, whole.of) == ("scrape windows", 2, 3)
    assert whole.flops_per_s == pytest.approx(4e9 / 0.5)
    assert whole.intensity == pytest.approx(2.0)
    # A server without the flag: its windows count nothing, and the point says the flag.
    plain = point_roofline(scrapes=[first, second, third])
    assert plain.whole is None
    record = plain.to_dict(ROOFS)
    assert MFU_FLAG in record["missing"]
    assert "flops_per_s" not in record  # never zeros


def test_saved_figures_read_back_with_flops_past_1e15(tmp_path: Path) -> None:
    from bench.sweep_files import load_saved
    from bench.sweep_result import SweepMetrics, SweepPoint

    # A 70B model's 4k prompts, three runs: 1.7e15 FLOPs, past the latency bound of 1e15.
    big = point_roofline([_step(1, 4096, 0, StepPerf(1.7e15, 1.4e11, 1e9, "vllm"), 2.0)])
    result = SweepResult(SweepConfig(prompt_lens=(4096,)), roofs=ROOFS)
    result.points.append(SweepPoint(4096, True, None, SweepMetrics(completed=1), (), big))
    path = tmp_path / "big.json"
    path.write_text(result.to_json())
    (saved,) = load_saved(path)  # type: ignore[misc]
    (point,) = saved.result.points
    assert point.roofline == big
    assert saved.result.roofs == ROOFS


async def test_a_real_sweep_sits_under_the_roofs_prefill_right_of_decode(
    vllm_engine: Engine,
) -> None:
    from cli.bench import bench_roofs

    roofs = bench_roofs(argparse.Namespace(hardware=None), vllm_engine, "cpu")
    assert isinstance(roofs, PointRoofs), roofs
    result = await run_sweep(
        vllm_engine, SweepConfig(prompt_lens=(32, 384), output_len=4, runs=1, warmup=0)
    )
    result.roofs = roofs
    prefill_intensity = []
    for point in result.points:
        assert point.roofline is not None and point.roofline.whole is not None
        parts = dict(point.roofline.by_kind)
        assert set(parts) == {"prefill", "decode"}
        for perf in (point.roofline.whole, *parts.values()):
            assert perf.source == "vllm"
            share = roof_share(perf, roofs)
            assert share is not None and not share.above, (point.prompt_len, perf, roofs)
        prefill, decode = parts["prefill"].intensity, parts["decode"].intensity
        assert prefill is not None and decode is not None
        assert prefill > decode, point.prompt_len
        prefill_intensity.append(prefill)
    # A longer prompt shares each weight read among more tokens.
    assert prefill_intensity[1] > prefill_intensity[0]
    data = json.loads(result.to_json())
    assert data["roofs"]["peak_flops"] == roofs.peak_flops
    for point in data["points"]:
        record = point["roofline"]
        assert record["binding_roof"] in ("compute", "bandwidth")
        assert 0 < record["share_of_roof"] <= 1
        assert (
            record["by_kind"]["prefill"]["intensity_flops_per_byte"]
            > (record["by_kind"]["decode"]["intensity_flops_per_byte"])
        )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "it is not JSON"),
        ('{"config": {}, "points": []}', 'has no "prompt_lens" key'),
    ],
)
def test_roofline_plot_of_a_bad_file_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    run = subprocess.run(
        [KVSCOPE, "roofline", "--plot", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert run.stderr.startswith(f"kvscope: Cannot load {path}: ")
    assert says in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_roofline_plot_of_a_fake_bench_draws_its_points_under_the_roofs(tmp_path: Path) -> None:
    path = tmp_path / "fake.json"
    bench = subprocess.run(
        [KVSCOPE, "bench", "--fake", "--prompt-lens", "64,512", "--output-len", "8",
         "--runs", "1", "--json", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert "Roofline per point" in bench.stdout
    old = json.loads(path.read_text())
    for point in old["points"]:
        del point["roofline"]
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps(old))
    run = subprocess.run(
        [KVSCOPE, "roofline", "--plot", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert "ridge" in run.stdout and "■" in run.stdout and "●" in run.stdout
    assert "125.0 FLOP/byte" in run.stdout  # the fake's set machine: 4 TFLOP/s / 32 GB/s
    refused = subprocess.run(
        [KVSCOPE, "roofline", "--plot", str(stale)], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "carry no roofline figures" in refused.stderr
