"""A sweep measured on a started engine: progress on stderr, the files saved after each point.

`kvscope bench` measures once; `bench --compare` once per config, on a fresh engine each.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from bench.sweep import make_floors, run_sweep
from engine.errors import BadOption, KvscopeError

if TYPE_CHECKING:
    from bench.sweep import FloorFn
    from bench.sweep_result import SweepConfig, SweepPoint, SweepResult
    from cli.result_files import ResultFile
    from engine.protocol import Engine


def check_output_len(config: SweepConfig, max_model_len: int | None) -> None:
    if max_model_len and config.output_len >= max_model_len:
        raise BadOption(
            "--output-len",
            f"{config.output_len:,} is not below the context limit (max_model_len) of "
            f"{max_model_len:,}, which the prompt and the output share",
        )


def measure(
    engine: Engine,
    config: SweepConfig,
    result: SweepResult,
    files: list[ResultFile],
    *,
    hardware: str | None,
) -> None:
    """Run the sweep on a started engine, appending each point to `result` and saving
    the files after it, so whatever stops the sweep finds everything measured so far."""
    from cli.launch import progress_bar, say

    card = engine.card
    check_output_len(config, card.max_model_len if card else None)
    result.model = dataclasses.asdict(card) if card else None
    floors: FloorFn | None = None
    if hardware and card is not None:
        try:
            floors, result.hardware = make_floors(card.path, hardware, config.output_len)
        except KvscopeError as exc:
            say(f"no roofline floors: {exc.plain()}")

    def save(point: SweepPoint) -> None:
        result.points.append(point)
        for f in files:
            f.write(result)

    with progress_bar("sweep") as progress:
        task = progress.add_task("sweep", total=1, stage="")

        def on_progress(done: int, total: int) -> None:
            progress.update(task, total=total, completed=done, stage=f"{done}/{total} runs")

        sweep = run_sweep(engine, config, on_point=save, on_progress=on_progress, floors=floors)
        asyncio.run(sweep)
    result.complete = True
    for f in files:
        f.write(result)
