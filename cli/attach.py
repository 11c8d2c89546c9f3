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
    from engine.fleet.fleet_engine import FleetEngine
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
        "--tokenizer",
        metavar="NAME_OR_FOLDER",
        help=(
            "for a server that is not vLLM's (no vLLM /tokenize): the tokenizer that counts "
            "and builds prompts here, as in `vllm bench serve` (default: the served model's "
            "own, if this machine has it, else kvscope's own model's); with it, "
            "--max-model-len N gives the context limit such a server does not say"
        ),
    )
    group.add_argument(
        "--replica",
        metavar="[NAME=]URL",
        action="append",
        default=[],
        help=(
            "a replica behind the --url router, scraped and followed on its own (repeat "
            "it; named a, b, ... unless NAME= is given): the fleet view shows each one's "
            "queue, KV and tokens/s, and where each prefix is cached; without --url, "
            "kvscope sends requests to the replicas in turn (round robin)"
        ),
    )
    group.add_argument(
        "--prefill",
        metavar="URL",
        help=(
            "prefill here, decode there: a vLLM server started with a KV connector as "
            "kv_producer (--kv-transfer-config), which prefills each prompt; give --decode "
            "too. Without --url kvscope is the proxy (prefill, then decode with the KV "
            "handed over); with --url (vllm-router --vllm-pd-disaggregation) the router is, "
            "and kvscope scrapes both servers. Both are rows of the fleet view"
        ),
    )
    group.add_argument(
        "--decode",
        metavar="URL",
        help="the kv_consumer server that decodes what --prefill prefilled",
    )
    group.add_argument(
        "--replica-kv-events",
        metavar="NAME=ENDPOINT",
        action="append",
        default=[],
        help=(
            "where replica NAME publishes KV-cache events, or NAME=off (repeat it); a "
            "replica not named is asked (its /kv_event_sources), as --kv-events auto does"
        ),
    )
    group.add_argument(
        "--router-metrics",
        metavar="URL",
        help=(
            "the router's own Prometheus endpoint (vllm-router --prometheus-port), e.g. "
            "http://127.0.0.1:29000/metrics: its per-worker counter says which replica "
            "served each request"
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

    max_model_len, engine_argv = _context_flag(engine_argv)
    if engine_argv:
        first = engine_argv[0]
        if not first.startswith("-"):
            # A word, not a flag: most likely a message typed where --prompt was meant.
            raise BadOption(first, "not an option of kvscope; a message goes in --prompt '...'")
        raise BadOption(
            " ".join(engine_argv[:3]),
            "vLLM engine flags belong to the server when attaching to one; "
            "start `vllm serve` with them instead",
        )
    kv_events = None if args.kv_events == "off" else args.kv_events
    return RemoteEngine(
        args.url,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        kv_events=kv_events,
        timeouts=args.timeout,
        tokenizer=args.tokenizer,
        max_model_len=max_model_len,
    )


def _context_flag(engine_argv: list[str]) -> tuple[int | None, list[str]]:
    """`--max-model-len N` among the engine flags: the limit of a server that does not say
    its own (vLLM's says it, and wins); the rest are left for the refusal."""
    from engine.errors import BadOption

    rest: list[str] = []
    found: int | None = None
    words = iter(engine_argv)
    for word in words:
        name, eq, value = word.partition("=")
        if name != "--max-model-len":
            rest.append(word)
            continue
        text = value if eq else next(words, "")
        try:
            found = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            found = 0
        if found <= 0:
            raise BadOption("--max-model-len", f"{text!r} is not a positive number of tokens")
    return found, rest


def attach_notice(engine: RemoteEngine) -> None:
    """One line on stderr saying what was attached and what cannot be seen remotely."""
    card = engine.card
    if card is None:
        return
    from engine.visible_text import visible

    limit = f"{card.max_model_len:,}" if card.max_model_len else "unknown"
    pool = (
        f"KV pool {card.total_blocks:,} blocks x {card.block_size}"
        if card.total_blocks
        else "KV pool unknown (no vLLM /metrics)"
    )
    print(
        f"kvscope: attached to {engine.url}: {visible(card.name)}, max_model_len {limit}, {pool}",
        file=sys.stderr,
    )
    for note in engine.api.notes():
        print(f"kvscope: {note}", file=sys.stderr)


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
    """`engine`, and each `--replica` scraped and followed beside it when there are some.

    Without a router (`args.round_robin`, set by `check_replicas`), `engine` is the first
    replica's, and kvscope sends each request to the next replica in turn.
    """
    if not args.replica:
        return engine
    return make_fleet(args, engine)


def make_fleet(args: argparse.Namespace, engine: RemoteEngine) -> FleetEngine:
    from engine.fleet.fleet_engine import FleetEngine
    from engine.fleet.replica_kv_events import OFF, parse_kv_settings
    from engine.fleet.replicas import parse_replicas
    from engine.fleet.round_robin import RoundRobinEngine
    from engine.remote import RemoteEngine

    replicas = parse_replicas(args.replica)
    kv = parse_kv_settings(args.replica_kv_events, replicas)
    if args.kv_events == "off":  # off for the whole fleet, unless a replica says otherwise
        kv = {name: OFF if setting == "auto" else setting for name, setting in kv.items()}
    router_metrics = _router_metrics(args.router_metrics)
    if getattr(args, "disaggregated", False):
        from engine.fleet.disaggregated import DisaggregatedEngine

        prefill = replicas.named(PREFILL)
        assert prefill is not None  # _fold_disaggregated named it
        prefill_engine = RemoteEngine(
            prefill.where,
            api_key=args.api_key,
            served_model_name=args.served_model_name,
            timeouts=args.timeout,
            scrape_interval_s=1.0,  # the decode server's scrapes feed the charts
        )
        pair = DisaggregatedEngine((PREFILL, prefill_engine), (DECODE, engine))
        return FleetEngine(pair, replicas, api_key=args.api_key, kv_settings=kv)
    if getattr(args, "round_robin", False):
        first, *rest = replicas
        engines = [(first.name, engine)] + [
            (
                r.name,
                RemoteEngine(
                    r.where,
                    api_key=args.api_key,
                    served_model_name=args.served_model_name,
                    timeouts=args.timeout,
                    # The first replica's scrapes feed the charts; these only re-attach.
                    scrape_interval_s=1.0,
                ),
            )
            for r in rest
        ]
        inner: RemoteEngine | RoundRobinEngine = RoundRobinEngine(engines)
        return FleetEngine(inner, replicas, api_key=args.api_key, kv_settings=kv)
    return FleetEngine(
        engine,
        replicas,
        api_key=args.api_key,
        kv_settings=kv,
        router_metrics=router_metrics,
        router_url=engine.url,
    )


def _router_metrics(text: str | None) -> str | None:
    if not text:
        return None
    from engine.errors import BadOption
    from engine.remote.client import parse_server_url, safe_url

    try:
        where = parse_server_url(text.strip())
    except BadOption as exc:
        raise BadOption("--router-metrics", f"{safe_url(text)!r}: {exc.reason}") from None
    from urllib.parse import urlsplit

    # A bare host:port means its /metrics; a path given is kept as it is.
    bare = urlsplit(text.strip()).path in ("", "/")
    return where.root.rstrip("/") + "/metrics" if bare else where.root


def check_replicas(args: argparse.Namespace) -> None:
    """`--replica` flags refused in words before anything starts.

    Without `--url`, the first replica stands in for it (so the server engine is chosen)
    and `args.round_robin` is set: kvscope routes the requests itself.
    """
    _fold_disaggregated(args)
    if not getattr(args, "replica", None):
        if getattr(args, "replica_kv_events", None):
            from engine.errors import BadOption

            raise BadOption("--replica-kv-events", "needs --replica: the replicas it names")
        return
    from engine.fleet.replica_kv_events import parse_kv_settings
    from engine.fleet.replicas import parse_replicas

    replicas = parse_replicas(args.replica)
    parse_kv_settings(args.replica_kv_events, replicas)
    _router_metrics(args.router_metrics)
    if not args.url:
        if args.router_metrics:
            from engine.errors import BadOption

            raise BadOption(
                "--router-metrics",
                "needs --url: the router whose counter it is (without --url, kvscope "
                "routes round robin and knows where each request went)",
            )
        decode = replicas.named(DECODE)
        if getattr(args, "disaggregated", False) and decode is not None:
            args.url = decode.where  # the proxy's own requests go to the decode server
        else:
            args.url = next(iter(replicas)).where
            args.round_robin = True


PREFILL, DECODE = "prefill", "decode"


def _fold_disaggregated(args: argparse.Namespace) -> None:
    """`--prefill URL --decode URL` become the replicas `prefill` and `decode`, the first
    of the fleet; without `--url` kvscope is their proxy (`args.disaggregated`).

    Once: the flags are cleared as they are folded in, as this runs before each start."""
    prefill, decode = getattr(args, "prefill", None), getattr(args, "decode", None)
    if prefill is None and decode is None:
        return
    from engine.errors import BadOption

    if not prefill or not decode:
        given, missing = ("--prefill", "--decode") if prefill else ("--decode", "--prefill")
        raise BadOption(
            missing,
            f"{given} needs {missing} too: prefill on one server, decode on the other "
            "(each started with --kv-transfer-config, as kv_producer and kv_consumer)",
        )
    taken = {r.partition("=")[0].strip() for r in args.replica}
    if taken & {PREFILL, DECODE}:
        raise BadOption(
            "--replica",
            f"the names {PREFILL!r} and {DECODE!r} are --prefill's and --decode's; "
            "give that replica another name",
        )
    args.replica = [f"{PREFILL}={prefill}", f"{DECODE}={decode}", *args.replica]
    args.prefill = args.decode = None
    args.disaggregated = not args.url
    if args.disaggregated and len(args.replica) > 2:
        raise BadOption(
            "--replica",
            "kvscope's own prefill/decode proxy takes one --prefill and one --decode "
            "server; for more, put vllm-router in front and give its --url",
        )


@contextmanager
def attached_engine(args: argparse.Namespace, engine_argv: list[str]) -> Iterator[Engine]:
    """`remote_engine`, or with `--replica` the fleet: every replica attached, scraped and
    followed while the block runs, then all let go."""
    if not args.replica:
        with remote_engine(args, engine_argv) as engine:
            yield engine
        return
    from cli.launch import progress_bar
    from engine.fleet.round_robin import RoundRobinEngine

    fleet = make_fleet(args, make_remote(args, engine_argv))
    try:
        with progress_bar("kvscope") as progress:
            task = progress.add_task(
                f"attaching to a fleet of {len(fleet.replicas)} replicas", total=1.0, stage=""
            )

            def on_progress(p: LoadProgress) -> None:
                progress.update(task, completed=p.fraction, stage=p.stage)

            fleet.start(on_progress)
        primary = fleet.inner.primary if isinstance(fleet.inner, RoundRobinEngine) else fleet.inner
        attach_notice(primary)
        print(f"kvscope: {fleet.routing}", file=sys.stderr)
        yield fleet
    finally:
        fleet.shutdown()  # the scrapers and subscribers, then every server's streams
