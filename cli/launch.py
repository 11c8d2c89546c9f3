"""Start a VllmEngine from command-line flags, with a progress bar on stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from engine.events import EmulationInfo, LoadProgress


def quiet_native_warnings() -> None:
    # torch's C++ warnings go straight to file descriptor 2; keep them to errors.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("TQDM_DISABLE", "1")


@contextmanager
def progress_bar(title: str) -> Iterator[Progress]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[stage]}"),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
        disable=not console.is_terminal,
    ) as progress:
        yield progress


def start_engine(
    engine_argv: Sequence[str],
    *,
    emulation: EmulationInfo | None = None,
    quiet: bool = False,
):  # -> VllmEngine (typed loosely so importing this module stays cheap)
    """Prepare the model if needed, build the engine and start it, showing progress."""
    quiet_native_warnings()
    from engine.vllm.engine import VllmEngine
    from engine.vllm.options import build_engine_settings

    if quiet:
        settings = build_engine_settings(engine_argv)
        engine = VllmEngine(
            settings.engine_args, model_label=settings.model_label, emulation=emulation
        )
        engine.start()
        return engine
    with progress_bar("kvscope") as progress:
        task = progress.add_task("preparing model", total=1.0, stage="")

        def on_model(stage: str, fraction: float) -> None:
            progress.update(task, completed=fraction * 0.3, stage=stage)

        settings = build_engine_settings(engine_argv, on_model)
        progress.update(task, description="starting engine")

        def on_engine(p: LoadProgress) -> None:
            progress.update(task, completed=0.3 + 0.7 * p.fraction, stage=p.stage)

        engine = VllmEngine(
            settings.engine_args, model_label=settings.model_label, emulation=emulation
        )
        engine.start(on_engine)
    if not quiet and not sys.stderr.isatty():
        card = engine.card
        assert card is not None
        print(
            f"kvscope: engine ready: {card.name} on {card.device}, max_model_len "
            f"{card.max_model_len}, KV pool {card.total_blocks} blocks x {card.block_size}",
            file=sys.stderr,
        )
    return engine
