"""`--url`: attach to a running vLLM server instead of starting an engine in-process.

The same flags for the playground, `generate` and `bench`. Attaching needs no vLLM, torch
or GPU on this machine: only `engine.remote` is imported.

`--url` is parsed as argparse reads it: a bad one is a one-line refusal before any engine
is chosen (an empty URL must not quietly start vLLM here), and a user and password in it
become a header at once, so `args.url` never holds them.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

from engine.remote.timeouts import DEFAULT_TIMEOUTS, Timeouts

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.events import LoadProgress
    from engine.protocol import Engine
    from engine.remote import RemoteEngine
    from engine.remote.client import ServerUrl


def server_url(text: str) -> ServerUrl:
    """argparse's `type` for --url: the parsed URL, or its reason as argparse's error."""
    from engine.errors import BadOption
    from engine.remote.client import parse_server_url

    try:
        return parse_server_url(text)
    except BadOption as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


def timeouts(text: str) -> Timeouts:
    """argparse's `type` for --timeout."""
    try:
        return Timeouts.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_attach_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "attach to a running vLLM server (instead of starting an engine here)"
    )
    group.add_argument(
        "--url",
        metavar="URL",
        type=server_url,
        help=(
            "a running `vllm serve`, e.g. http://127.0.0.1:8000 (https works too; "
            "http://user:password@host sends those as Basic auth and shows them nowhere)"
        ),
    )
    group.add_argument(
        "--timeout",
        metavar="S|C,F,B",
        type=timeouts,
        default=DEFAULT_TIMEOUTS,
        help=(
            "seconds to wait on the server: to connect, for a reply's first byte, and "
            "between two chunks of a reply; one number sets all three "
            f"(default {DEFAULT_TIMEOUTS.flag()})"
        ),
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
        "--replica",
        metavar="[NAME=]URL",
        action="append",
        default=[],
        help=(
            "a replica behind the --url router, scraped on its own (repeat it; named a, "
            "b, ... unless NAME= is given): the fleet view shows each one's queue, KV and "
            "tokens/s, and an imbalance line"
        ),
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
        timeouts=args.timeout,
    )


def attach_notice(engine: RemoteEngine) -> None:
    """One line on stderr saying what was attached and what cannot be seen remotely."""
    card = engine.card
    if card is None:
        return
    from engine.visible_text import visible

    print(
        f"kvscope: attached to {engine.url}: {visible(card.name)}, max_model_len "
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
            # engine.url, not the flag as typed: it holds no password.
            task = progress.add_task(f"attaching to {engine.url}", total=1.0, stage="")

            def on_progress(p: LoadProgress) -> None:
                progress.update(task, completed=p.fraction, stage=p.stage)

            engine.start(on_progress)
        attach_notice(engine)
        yield engine
    finally:
        engine.shutdown()


def with_fleet(args: argparse.Namespace, engine: RemoteEngine) -> Engine:
    """`engine`, and each `--replica` scraped beside it when there are some."""
    if not args.replica:
        return engine
    from engine.fleet.fleet_engine import FleetEngine
    from engine.fleet.replicas import parse_replicas

    return FleetEngine(engine, parse_replicas(args.replica), api_key=args.api_key)


def check_replicas(args: argparse.Namespace) -> None:
    """`--replica` flags refused in words before anything starts."""
    if not getattr(args, "replica", None):
        return
    from engine.errors import BadOption
    from engine.fleet.replicas import parse_replicas

    if not args.url:
        raise BadOption(
            "--replica",
            "needs --url: the router the requests go through (or one of the replicas)",
        )
    parse_replicas(args.replica)


@contextmanager
def attached_engine(args: argparse.Namespace, engine_argv: list[str]) -> Iterator[Engine]:
    """`remote_engine`, with the fleet's replicas scraped while it is attached."""
    with remote_engine(args, engine_argv) as engine:
        fleet = with_fleet(args, engine)
        if fleet is engine:
            yield engine
            return
        from engine.fleet.fleet_engine import FleetEngine

        assert isinstance(fleet, FleetEngine)
        fleet.watch()
        try:
            yield fleet
        finally:
            fleet.shutdown()  # the scrapers, then the server's streams (again: harmless)
