"""`--url`: attach to a running vLLM server instead of starting an engine in-process.

The same flags for the playground, `generate` and `bench`. Attaching needs no vLLM, torch
or GPU on this machine: only `engine.remote` is imported.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

    from engine.events import LoadProgress
    from engine.remote import RemoteEngine


def add_attach_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "attach to a running vLLM server (instead of starting an engine here)"
    )
    group.add_argument(
        "--url",
        metavar="URL",
        help="a running `vllm serve`, e.g. http://127.0.0.1:8000 (https works too)",
    )
    group.add_argument(
        "--api-key",
        metavar="KEY",
        help="the server's --api-key (default: $VLLM_API_KEY, then $OPENAI_API_KEY)",
    )
    group.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="which model to use when the server serves several",
    )
    group.add_argument(
        "--kv-events",
        metavar="ENDPOINT",
        default="auto",
        help=(
            "where the server publishes KV-cache events: 'auto' (ask the server), 'off', "
            "or the endpoint given in its --kv-events-config"
        ),
    )


def make_remote(args: argparse.Namespace, engine_argv: list[str]) -> RemoteEngine:
    """A RemoteEngine for `--url`; engine flags make no sense there, so they are refused."""
    from engine.errors import BadOption
    from engine.remote import RemoteEngine

    if engine_argv:
        raise BadOption(
            " ".join(engine_argv[:3]),
            "vLLM engine flags belong to the server when attaching with --url; "
            "start `vllm serve` with them instead",
        )
    kv_events = None if args.kv_events == "off" else args.kv_events
    return RemoteEngine(
        args.url,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        kv_events=kv_events,
    )


def attach_notice(engine: RemoteEngine) -> None:
    """One line on stderr saying what was attached and what cannot be seen remotely."""
    card = engine.card
    if card is None:
        return
    print(
        f"kvscope: attached to {engine.url}: {card.name}, max_model_len "
        f"{card.max_model_len:,}, KV pool {card.total_blocks:,} blocks x {card.block_size}",
        file=sys.stderr,
    )


@contextmanager
def remote_engine(args: argparse.Namespace, engine_argv: list[str]) -> Iterator[RemoteEngine]:
    """Attach with progress on stderr, and always let go of the server's streams."""
    from cli.launch import progress_bar

    engine = make_remote(args, engine_argv)
    try:
        with progress_bar("kvscope") as progress:
            task = progress.add_task(f"attaching to {args.url}", total=1.0, stage="")

            def on_progress(p: LoadProgress) -> None:
                progress.update(task, completed=p.fraction, stage=p.stage)

            engine.start(on_progress)
        attach_notice(engine)
        yield engine
    finally:
        engine.shutdown()
