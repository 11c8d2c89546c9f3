"""The batched-decode roofline: memory-bound at small batches, compute-bound past a batch
that the arithmetic names, and the KV pool's own cap on the batch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_helpers import KVSCOPE

from roofline.batched import (
    batched_report,
    batched_step,
    compute_bound_batch,
    max_batch_in_pool,
    throughput_ceiling,
)
from roofline.floors import concurrent_requests, itl_floor_s
from roofline.hardware import load_profile, shipped_geometry

ROOT = Path(__file__).resolve().parents[1]
GEOM = shipped_geometry("qwen2.5-7b-instruct")
L4 = load_profile("l4")


def test_a_small_batch_costs_about_one_pass_over_the_weights() -> None:
    one, many = batched_step(GEOM, L4, 1, 1024), batched_step(GEOM, L4, 32, 1024)
    assert one.bound == many.bound == "memory"
    assert one.step_s == pytest.approx(GEOM.weight_bytes / L4.mem_bandwidth_bytes_s, rel=0.05)
    # 32 times the tokens for much less than twice the step time.
    assert many.step_s < 1.5 * one.step_s
    assert many.tokens_per_s > 20 * one.tokens_per_s
    assert many.step_s == itl_floor_s(GEOM, L4, 1024, batch=32)


def test_the_compute_bound_batch_is_where_the_two_roofs_cross() -> None:
    # At a short context the KV read per request is small: compute catches up.
    b = compute_bound_batch(GEOM, L4, 16)
    assert b is not None
    assert batched_step(GEOM, L4, b, 16).bound == "compute"
    assert batched_step(GEOM, L4, b - 1, 16).bound == "memory"
    # At a long context each request's KV costs more to read than its FLOPs: never.
    assert compute_bound_batch(GEOM, L4, 32_768) is None


def test_the_pool_caps_the_batch() -> None:
    cap = max_batch_in_pool(GEOM, L4, 4096)
    assert cap == concurrent_requests(GEOM, L4, 4096)
    assert batched_step(GEOM, L4, cap, 4096).fits
    assert not batched_step(GEOM, L4, cap + 1, 4096).fits
    report = batched_report(GEOM, L4, [1, 8, 32, 128], 4096)
    assert report.max_batch_in_pool == cap
    assert "KV pool holds" in report.sentence()
    assert throughput_ceiling(GEOM, L4, 4096)(8) == pytest.approx(report.steps[1].tokens_per_s)


def test_roofline_cli_prints_the_batched_table_and_json() -> None:
    out = subprocess.run(
        [KVSCOPE, "roofline", "--gpu", "l4", "--prompt-lens", "512", "--batch", "1,8,32,128"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Batched decode" in out.stdout and "compute-bound" in out.stdout
    js = subprocess.run(
        [KVSCOPE, "roofline", "--gpu", "l4", "--prompt-lens", "512", "--batch", "1,8", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    data = json.loads(js.stdout)
    assert [s["batch"] for s in data["batched"][0]["steps"]] == [1, 8]
    bad = subprocess.run(
        [KVSCOPE, "roofline", "--batch", "1,x"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("kvscope: Bad value for --batch")
