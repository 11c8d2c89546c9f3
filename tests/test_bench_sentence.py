"""The bench's closing sentence says what its numbers show, and its table speaks one unit.

Found on a busy 2-core host: "prompt x4: TTFT x3.0, median ITL x0.18. TTFT grew ... while
ITL stayed nearly flat", for an ITL that moved 5.5x. A fall is as much a move as a rise,
and a busy host is named as the cause, not read as the engine's behaviour.
"""

from __future__ import annotations

import io
import re

from rich.console import Console

from bench.sweep_result import SweepConfig, SweepMetrics, SweepPoint, SweepResult
from cli.sweep_table import render_summary, verdict
from roofline.floors import FLOOR_BEATEN


def test_an_itl_that_fell_5x_on_a_busy_host_is_not_called_flat() -> None:
    line = verdict(4, 3.0, 0.18, load=5.0, cores=2)
    assert "TTFT x3.0, median ITL x0.18" in line
    assert "ITL moved 5.6x" in line
    assert "the host was busy (load 5.0 on 2 cores)" in line
    assert "cannot show the decode claim" in line
    assert "flat" not in line


def test_an_itl_that_fell_on_a_quiet_host_is_said_to_be_impossible() -> None:
    line = verdict(4, 3.0, 0.18, load=0.5, cores=2)
    assert "ITL fell 5.6x" in line
    assert "cannot show the decode claim" in line
    assert "busy (load" not in line


def test_the_finding_on_a_busy_host_names_the_load() -> None:
    line = verdict(8, 20.4, 1.4, load=5.0, cores=2)
    assert "prefill is compute-bound and decode memory-bound" in line
    assert "load 5.0 on 2 cores" in line


def test_an_itl_that_grew_on_a_busy_host_blames_the_host() -> None:
    line = verdict(8, 20.4, 3.0, load=4.5, cores=2)
    assert "ITL moved 3.0x: the host was busy (load 4.5 on 2 cores)" in line


def _point(n: int, ttft: float, itl: float, ttft_pct: float, itl_pct: float) -> SweepPoint:
    metrics = SweepMetrics(
        completed=1,
        mean_ttft_ms=ttft,
        median_ttft_ms=ttft,
        p99_ttft_ms=ttft,
        median_itl_ms=itl,
        p99_itl_ms=itl,
        mean_tpot_ms=itl,
        mean_e2el_ms=ttft + 8 * itl,
        output_throughput=30.0,
        ttft_floor_ms=ttft * ttft_pct / 100,
        itl_floor_ms=itl * itl_pct / 100,
        ttft_pct_of_floor=ttft_pct,
        itl_pct_of_floor=itl_pct,
    )
    return SweepPoint(n, True, None, metrics)


def _render(points: list[SweepPoint]) -> str:
    result = SweepResult(SweepConfig(prompt_lens=tuple(p.prompt_len for p in points)))
    result.points.extend(points)
    out = io.StringIO()
    render_summary(result, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_every_duration_column_says_ms_and_a_beaten_floor_is_a_bug() -> None:
    text = _render([_point(512, 412.0, 23.5, 71.0, 48.0), _point(2048, 1236.0, 24.0, 879.0, 44.0)])
    header = next(line for line in text.splitlines() if "TTFT" in line and "ITL" in line)
    columns = [c.strip() for c in re.split(r"[┃│]", header) if c.strip()]
    durations = [c for c in columns if re.search(r"TTFT|ITL|TPOT|E2EL", c) and "floor" not in c]
    assert len(durations) == 7, columns
    assert all(c.endswith(" ms") for c in durations), durations
    assert "879%" not in text
    assert re.search(r"\b[1-9]\d{2,}%", text) is None  # no share of a floor over 100 %
    assert "beaten ✗" in text
    assert FLOOR_BEATEN in text
    assert "71%" in text


def test_a_floor_far_under_the_measurement_gets_a_log_chart() -> None:
    text = _render([_point(512, 412.0, 23.5, 4.0, 48.0), _point(2048, 1836.0, 24.0, 4.0, 44.0)])
    assert "TTFT (ms) vs prompt length, log scale" in text
    assert "median ITL (ms) vs prompt length, log scale" not in text
