"""A saved load run read back (`bench.sweep_files.load_saved`), for the sweep screen's F9:
what `LoadResult.to_json` wrote comes back whole, and a file that is not one says why."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import pytest

from bench.load_result import LoadConfig, LoadPoint, LoadResult, StepView
from bench.sweep_files import SavedLoad, SavedSweep, SweepFileError, load_saved

if TYPE_CHECKING:
    from pathlib import Path

FIXTURES_SAVED = "fixtures/sweep/saved.json"


def _result() -> LoadResult:
    config = LoadConfig(mode="rate", levels=(2.0, math.inf), prompt_len=64, output_len=16)
    steps = StepView("steps", 40, 3.5, 6, 0.5, 2, 0.3, 0.5, 1, 0.2, 0.1, 0.0, 1.0)
    points = [
        LoadPoint(
            "rate", None, 2.0, 1.0, completed=8, output_throughput=55.5, median_itl_ms=21.0,
            schedule_error_p99_ms=0.4, steps=steps, notes=("a note",),
            requests=({"request_id": "load-0-1-0", "ttft_s": 0.1},),
        ),
        LoadPoint(
            "rate", None, math.inf, None, completed=8, output_throughput=90.0,
            median_itl_ms=30.0, queued_requests=6, stopped_early=None,
        ),
    ]  # fmt: skip
    return LoadResult(config, points, model={"name": "fake/m"}, complete=False)


def _write(folder: Path, name: str, data: Any) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_load_run_reads_back_whole(tmp_path: Path) -> None:
    result = _result()
    saved = load_saved(_write(tmp_path, "load.json", result.to_json()))
    assert isinstance(saved, SavedLoad)
    back = saved.result
    assert back.config.mode == "rate" and back.config.levels == (2.0, math.inf)
    assert back.complete is False and back.model == {"name": "fake/m"}
    for live, read in zip(result.points, back.points, strict=True):
        assert read.row() == live.row()
        assert read.steps == live.steps
        assert read.requests == live.requests
    assert back.points[1].request_rate == math.inf and back.points[1].label == "rate inf"


def test_a_prompt_length_sweep_still_reads_as_one(tmp_path: Path) -> None:
    from pathlib import Path as RealPath

    saved = load_saved(RealPath(__file__).parent / FIXTURES_SAVED)
    assert isinstance(saved, list) and isinstance(saved[0], SavedSweep)


def _bad(folder: Path) -> list[tuple[Path, str]]:
    good = json.loads(_result().to_json())
    point = good["points"][0]
    return [
        (_write(folder, "no-points.json", {**good, "points": None}), 'the file has "points": None'),
        (
            _write(folder, "mode.json", {**good, "config": {**good["config"], "mode": "x"}}),
            'it is not a load sweep: the file\'s "config" has "mode": \'x\', not',
        ),
        (
            _write(folder, "profile.json", {**good, "points": [{**point, "profile": "fast"}]}),
            "point 1 of the file has \"profile\": 'fast', not one of",
        ),
        (
            _write(folder, "words.json", {**good, "points": [{**point, "median_itl_ms": "low"}]}),
            "point 1 of the file has \"median_itl_ms\": 'low', not a number",
        ),
        (
            _write(folder, "failed.json", {**good, "points": [{**point, "ok": False}]}),
            "it holds no measured load point (its one level failed)",
        ),
        (
            _write(folder, "empty.json", {**good, "points": []}),
            "it holds no measured load point (its list of points is empty)",
        ),
    ]


@pytest.mark.parametrize("case", range(6))
def test_a_file_that_is_not_a_load_run_says_why(tmp_path: Path, case: int) -> None:
    path, words = _bad(tmp_path)[case]
    with pytest.raises(SweepFileError) as caught:
        load_saved(path)
    message = caught.value.plain()
    assert message.startswith(f"Cannot load {path}: ")
    assert words in message, message
    assert "\n" not in message
