"""`kvscope bench` in load mode: users or request rates, `--sweep` and `--find-max`.

A list of concurrencies, any `--request-rate`, `--sweep`, `--find-max` or a load-only
flag (`--num-prompts`, `--duration`, `--goodput`, ...) turns it on; one concurrency with
prompt lengths stays the prompt-length sweep. Flags are checked before any engine starts.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from bench.arrivals import ARRIVAL_KINDS
from bench.goodput import parse_goodput
from bench.load_result import LoadConfig, LoadResult
from bench.load_runner import LoadRunner, LoadTick, levels_of, validate
from bench.sweep_result import fresh_seed
from cli.load_table import render_load, render_multi_turn
from cli.result_files import ResultFile, say_problems
from cli.roofline import parse_int_list, parse_int_option
from engine.errors import BadOption, KvscopeError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from bench.arrivals import ArrivalKind
    from bench.load_result import LoadPoint
    from bench.load_runner import Ceiling
    from bench.multi_turn import MultiTurnConfig, MultiTurnResult, MultiTurnTick
    from engine.protocol import Engine

    BenchEngine = Callable[..., AbstractContextManager[Engine]]
    """cli.bench's `bench_engine(args, engine_argv, check=...)`: --fake, --url or vLLM."""

EXIT_SOME_FAILED = 3


def add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "load (a --concurrency list, --request-rate, --sweep or --find-max turns it on)",
        description=(
            "Failed requests (an HTTP error, a cut stream, a --timeout, a server that is\n"
            "down) are counted on every point as 'N of M failed', by cause, in the table\n"
            "and the JSON, and count as missing every --goodput objective.\n"
            "exit status in load mode: 0 when every request of every point completed,\n"
            f"{EXIT_SOME_FAILED} when any request or point failed (stderr says which), "
            "1 or 2 on errors\nbefore the load."
        ),
    )
    g.add_argument(
        "--request-rate",
        metavar="R,R,...",
        help="open loop: requests/s per point, e.g. 0.5,1,2,inf (inf sends all at once)",
    )
    g.add_argument(
        "--arrival",
        choices=ARRIVAL_KINDS,
        help="how an open loop spaces its sends (poisson; gamma when --burstiness is set)",
    )
    g.add_argument(
        "--burstiness", metavar="K", help="gamma shape of the gaps, as vLLM's (1 = Poisson)"
    )
    g.add_argument(
        "--seed", metavar="N", help="prompt and arrival seed (default: a fresh one each run)"
    )
    g.add_argument("--num-prompts", metavar="N", help="requests per point")
    g.add_argument("--duration", metavar="S", help="seconds per point (instead of a count)")
    g.add_argument(
        "--range-ratio",
        metavar="R",
        help="spread prompt and output lengths over [n(1-R), n(1+R)], as vLLM's random dataset",
    )
    g.add_argument(
        "--shared-prefix",
        metavar="N",
        help="every prompt of a point starts with the same N tokens (studies prefix caching)",
    )
    g.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="objectives, as vLLM's: ttft:2000 tpot:100 e2el:10000 (milliseconds)",
    )
    g.add_argument(
        "--sweep",
        action="store_true",
        help="synchronous, then all at once, then rates in between (GuideLLM's sweep)",
    )
    g.add_argument(
        "--find-max",
        action="store_true",
        help="search the highest load that meets --goodput (rate, or users with --concurrency)",
    )
    add_multi_turn_args(p)


def add_multi_turn_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "multi-turn chat (--turns or --sessions turns it on; --compare-urls compares routers)"
    )
    g.add_argument(
        "--turns",
        metavar="N",
        help="turns per chat session (4): each turn sends the conversation so far (the "
        "replies as received) plus a new user message",
    )
    g.add_argument(
        "--sessions",
        metavar="M",
        help="chat sessions at once (1), one user each, its turns in order",
    )
    g.add_argument(
        "--message-len",
        metavar="N",
        help="words (about tokens) in each new user message (64); replies are --output-len",
    )
    g.add_argument(
        "--compare-urls",
        metavar="NAME=URL,NAME=URL",
        help="the same chats through each of these URLs in turn (two routers in front of "
        "the same replicas, one per policy), e.g. "
        "round_robin=http://127.0.0.1:8080,cache_aware=http://127.0.0.1:8081; prints TTFT "
        "by turn, prefix hit rate and throughput per URL",
    )


_LOAD_ONLY = ("num_prompts", "duration", "goodput", "range_ratio", "shared_prefix")
# Flags of the other bench modes, refused by name in a multi-turn run.
_NOT_MULTI_TURN = (
    ("concurrency", "--concurrency", "each session is one user: give --sessions M"),
    ("prompt_lens", "--prompt-lens", "a turn's prompt is the chat so far: give --message-len"),
    ("request_rate", "--request-rate", "sessions send each turn when the last reply ends"),
    ("arrival", "--arrival", "sessions send each turn when the last reply ends"),
    ("burstiness", "--burstiness", "sessions send each turn when the last reply ends"),
    ("sweep", "--sweep", "it sweeps load levels, not chats"),
    ("find_max", "--find-max", "it searches load levels, not chats"),
    ("num_prompts", "--num-prompts", "the run sends --sessions x --turns requests"),
    ("duration", "--duration", "the run sends --sessions x --turns requests"),
    ("goodput", "--goodput", "not measured for chats"),
    ("range_ratio", "--range-ratio", "every message has --message-len words"),
    ("shared_prefix", "--shared-prefix", "each session's own turns are its shared prefix"),
    ("compare", "--compare", "it restarts an in-process engine; for routers use --compare-urls"),
    ("runs", "--runs", "it repeats a prompt-length sweep; the run sends --sessions x --turns"),
    ("hardware", "--hardware", "chats get no roofline floors"),
    ("no_roofline", "--no-roofline", "chats get no roofline floors"),
)


def wants_multi_turn(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, name, None) is not None
        for name in ("turns", "sessions", "message_len", "compare_urls")
    )


def multi_turn_config_from_args(args: argparse.Namespace) -> MultiTurnConfig:
    """Every multi-turn flag checked, in one plain line each, before any engine starts."""
    from bench.multi_turn import MultiTurnConfig

    for name, flag, why in _NOT_MULTI_TURN:
        value = getattr(args, name, None)
        if value is not None and value is not False:
            raise BadOption(flag, f"not with --turns/--sessions: {why}")
    if args.compare_urls is not None and args.turns is None and args.sessions is None:
        raise BadOption(
            "--compare-urls", "it compares multi-turn chats: give --turns N --sessions M"
        )
    seed = fresh_seed() if args.seed is None else parse_int_option(args.seed, "--seed", 0)
    config = MultiTurnConfig(
        sessions=1 if args.sessions is None else parse_int_option(args.sessions, "--sessions", 1),
        turns=4 if args.turns is None else parse_int_option(args.turns, "--turns", 1),
        message_len=64
        if args.message_len is None
        else parse_int_option(args.message_len, "--message-len", 1),
        output_len=parse_int_option(args.output_len, "--output-len", 1),
        seed=seed,
        warmup=parse_int_option(args.warmup, "--warmup", 0),
    )
    config.validate()
    return config


def multi_turn_files(args: argparse.Namespace) -> list[ResultFile]:
    """--json and --csv of a multi-turn run (or comparison: anything with to_json/to_csv)."""
    files: list[ResultFile] = []
    if args.json_path:
        files.append(ResultFile("--json", args.json_path, lambda r: r.to_json()))
    if args.csv_path:
        files.append(ResultFile("--csv", args.csv_path, lambda r: r.to_csv()))
    return files


def run_multi_turn_bench(
    args: argparse.Namespace, engine_argv: list[str], bench_engine: BenchEngine
) -> int:
    """`bench --turns N --sessions M`: one run on the engine the flags ask for (opened by
    `bench_engine`), or with --compare-urls, one run through each URL (cli/compare.py)."""
    from cli.launch import int_flag

    config = multi_turn_config_from_args(args)  # every bad flag stops here
    config.check_fits(int_flag(engine_argv, "--max-model-len"))
    files = multi_turn_files(args)
    if args.compare_urls is not None:
        from cli.compare import report_compare_urls, run_compare_urls

        def measure(engine: Engine, c: MultiTurnConfig, label: str, url: str) -> MultiTurnResult:
            return measure_multi_turn(engine, c, label=label, url=url)

        done = run_compare_urls(args, config, engine_argv, files, measure)
        return report_compare_urls(done, files)
    for f in files:
        f.check()
    url = args.url.root if args.url else None
    with bench_engine(
        args, engine_argv, check=lambda ns: config.check_fits(ns.max_model_len)
    ) as engine:
        result = measure_multi_turn(engine, config, label="", url=url)
    for f in files:
        f.write(result)
    render_multi_turn(result, Console(file=sys.stdout, width=160))
    say_problems(files)
    return _exit_for([result])


def measure_multi_turn(
    engine: Engine, config: MultiTurnConfig, *, label: str, url: str | None
) -> MultiTurnResult:
    """One multi-turn run on a started engine, with a progress bar on stderr."""
    from bench.multi_turn import run_multi_turn
    from cli.launch import progress_bar

    with progress_bar("chat") as progress:
        planned = config.sessions * config.turns
        name = f"{label}: " if label else ""
        task = progress.add_task(f"{name}chat turns", total=planned, stage="")

        def on_progress(t: MultiTurnTick) -> None:
            progress.update(task, completed=t.done, stage=f"{t.done}/{t.planned} turns done")

        return asyncio.run(
            run_multi_turn(engine, config, label=label, url=url, on_progress=on_progress)
        )


def _exit_for(results: list[MultiTurnResult]) -> int:
    """0 when every turn was answered; 3 when some failed (said on stderr)."""
    from cli.launch import say

    failed = [r for r in results if r.failed]
    for r in failed:
        name = f"{r.label}: " if r.label else ""
        say(f"{name}{r.failed} of {len(r.records)} turns failed: {r.first_error}")
    return EXIT_SOME_FAILED if failed else 0


def wants_load(args: argparse.Namespace) -> bool:
    several_users = args.concurrency is not None and "," in str(args.concurrency)
    return (
        several_users
        or args.request_rate is not None
        or args.sweep
        or args.find_max
        or any(getattr(args, name) is not None for name in _LOAD_ONLY)
    )


def parse_rates(text: str) -> tuple[float, ...]:
    items = [part.strip() for part in str(text).split(",")]
    rates = []
    for item in items:
        try:
            rate = float(item)
        except ValueError:
            raise BadOption("--request-rate", f"{item!r} is not a number (or inf)") from None
        if math.isnan(rate):
            raise BadOption("--request-rate", f"{item!r} is not a number (or inf)")
        rates.append(rate)
    return tuple(rates)


def _float(value: Any, option: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadOption(option, f"{value!r} is not a number") from None
    if math.isnan(number):
        raise BadOption(option, "NaN is not a number")
    return number


def load_config_from_args(args: argparse.Namespace) -> LoadConfig:
    """Every load flag checked, in one plain line each, before any engine starts."""
    prompt_lens = parse_int_list(
        "512" if args.prompt_lens is None else args.prompt_lens, "--prompt-lens"
    )
    if len(prompt_lens) > 1:
        raise BadOption(
            "--prompt-lens", "load mode measures one prompt length (--range-ratio spreads it)"
        )
    if args.sweep and args.find_max:
        raise BadOption("--sweep", "choose --sweep or --find-max, not both")
    if getattr(args, "runs", None) is not None:
        raise BadOption(
            "--runs",
            f"{args.runs} runs repeat each length of a prompt-length sweep; a load point "
            "runs --num-prompts N requests or --duration S instead",
        )
    _check_search_levels(args)
    rate_mode = args.request_rate is not None or (
        args.concurrency is None and (args.sweep or args.find_max)
    )
    if args.request_rate is not None and args.concurrency is not None:
        raise BadOption("--request-rate", "give --request-rate or --concurrency, not both")
    if rate_mode:
        levels = parse_rates(args.request_rate or "1")
    else:
        levels = tuple(float(n) for n in parse_int_list(args.concurrency or "1", "--concurrency"))
    burstiness = 1.0 if args.burstiness is None else _float(args.burstiness, "--burstiness")
    arrival: ArrivalKind = args.arrival or ("gamma" if burstiness != 1.0 else "poisson")
    if args.burstiness is not None and arrival != "gamma" and burstiness != 1.0:
        raise BadOption(
            "--burstiness", f"it shapes gamma arrivals, not {arrival} ones: use --arrival gamma"
        )
    if (args.arrival or args.burstiness) and not rate_mode:
        which = "--arrival" if args.arrival else "--burstiness"
        raise BadOption(which, "it shapes an open loop's arrivals: give --request-rate")
    if args.num_prompts is not None and args.duration is not None:
        raise BadOption("--duration", "give --duration or --num-prompts, not both")
    goodput = parse_goodput(args.goodput) if args.goodput is not None else {}
    if args.find_max and not goodput:
        raise BadOption("--find-max", "it searches within objectives: give --goodput ttft:MS ...")
    seed = fresh_seed() if args.seed is None else parse_int_option(args.seed, "--seed", 0)
    config = LoadConfig(
        mode="rate" if rate_mode else "concurrency",
        levels=levels,
        prompt_len=prompt_lens[0],
        output_len=parse_int_option(args.output_len, "--output-len", 1),
        range_ratio=0.0 if args.range_ratio is None else _float(args.range_ratio, "--range-ratio"),
        num_prompts=None
        if args.num_prompts is None
        else parse_int_option(args.num_prompts, "--num-prompts", 1),
        duration_s=None if args.duration is None else _float(args.duration, "--duration"),
        warmup=parse_int_option(args.warmup, "--warmup", 0),
        arrival=arrival,
        burstiness=burstiness,
        seed=seed,
        shared_prefix=0
        if args.shared_prefix is None
        else parse_int_option(args.shared_prefix, "--shared-prefix", 0),
        goodput=goodput,
        sweep=args.sweep,
        find_max=args.find_max,
    )
    validate(config)
    return config


def _check_search_levels(args: argparse.Namespace) -> None:
    """--sweep picks every level itself and --find-max searches up from one: a level list
    given beside them would be dropped in silence, so it is refused, saying what to give."""
    given = [
        (flag, value)
        for flag, value in (
            ("--request-rate", args.request_rate),
            ("--concurrency", args.concurrency),
        )
        if value is not None
    ]
    if not given:
        return
    flag, value = given[0]
    text = str(value).strip()
    if args.sweep:
        raise BadOption(
            "--sweep",
            "it chooses its own levels (1 user, then all at once, then 4 rates between): "
            f"not with {flag} {text}; give a list without --sweep to measure those levels",
        )
    if args.find_max and "," in text:
        first = text.split(",")[0].strip()
        raise BadOption(
            "--find-max",
            f"it searches up from one starting level, so {flag} {text} would be ignored "
            f"past its first: give one, e.g. {flag} {first}, or measure the list without "
            "--find-max",
        )


def check_load_output_len(config: LoadConfig, max_model_len: int | None) -> None:
    if max_model_len and config.output_len >= max_model_len:
        raise BadOption(
            "--output-len",
            f"{config.output_len:,} is not below the context limit (max_model_len) of "
            f"{max_model_len:,}, which the prompt and the output share",
        )


def load_files(args: argparse.Namespace) -> list[ResultFile]:
    files: list[ResultFile] = []
    if args.json_path:
        files.append(ResultFile("--json", args.json_path, LoadResult.to_json))
    if args.csv_path:
        files.append(ResultFile("--csv", args.csv_path, LoadResult.to_csv))
    return files


def ceiling_for(engine: Engine, config: LoadConfig, hardware: str | None) -> Ceiling | None:
    """The roofline's batched-decode ceiling for the engine's model, when there is one."""
    from cli.launch import say

    card = engine.card
    if hardware is None or card is None or card.device == "fake":
        return None
    try:
        from roofline.batched import throughput_ceiling
        from roofline.hardware import load_geometry, load_profile

        geom = load_geometry(card.path)
        hw = load_profile(hardware, option="--hardware")
    except KvscopeError as exc:
        say(f"no roofline ceiling: {exc.plain()}")
        return None
    return throughput_ceiling(geom, hw, config.prompt_len + config.output_len // 2)


def measure_load(
    engine: Engine,
    config: LoadConfig,
    result: LoadResult,
    files: list[ResultFile],
    *,
    hardware: str | None,
) -> None:
    """Run the load on a started engine, saving the files after every point."""
    import dataclasses

    from bench.find_max import find_max
    from bench.load_sweep import run_load_sweep
    from cli.launch import progress_bar

    card = engine.card
    check_load_output_len(config, card.max_model_len if card else None)
    result.model = dataclasses.asdict(card) if card else None
    ceiling = ceiling_for(engine, config, hardware)
    if ceiling is not None and hardware:
        result.hardware = {"key": hardware}

    def save(point: LoadPoint) -> None:
        result.points.append(point)
        for f in files:
            f.write(result)

    with progress_bar("load") as progress:
        task = progress.add_task("load", total=1, stage="")

        def on_progress(t: LoadTick) -> None:
            of = f"/{t.points}" if t.points else ""
            planned = t.planned or max(t.sent, 1)
            progress.update(
                task,
                total=planned,
                completed=t.done,
                description=f"point {t.point}{of}: {t.label}",
                stage=f"{t.done}/{t.planned or '?'} done, {t.sent - t.done} in flight",
            )

        runner = LoadRunner(engine, config, on_progress=on_progress, ceiling=ceiling)

        async def run() -> None:
            await runner.warm_up()
            if config.sweep:
                await run_load_sweep(runner, on_point=save)
            elif config.find_max:
                found = await find_max(
                    runner,
                    config.mode,
                    config.levels[0],
                    config.goodput,
                    on_probe=lambda probe: save(probe.point),
                )
                result.find_max = found.to_dict()
            else:
                for level in levels_of(config):
                    save(await runner.measure(level, points=len(config.levels)))

        asyncio.run(run())
    result.complete = True
    for f in files:
        f.write(result)


def report_load(result: LoadResult, files: list[ResultFile]) -> int:
    """The table and sentence; then 0, or EXIT_SOME_FAILED when any request or point
    failed (a point with failed requests is not ok), said in one line on stderr."""
    render_load(result, Console(file=sys.stdout, width=160))
    say_problems(files)
    failed = [p for p in result.points if not p.ok]
    if failed:
        requests = sum(p.failed for p in result.points)
        of = f"{requests:,} request{'' if requests == 1 else 's'} failed; " if requests else ""
        print(
            f"kvscope: {of}{len(failed)} of {len(result.points)} load points failed: "
            + "; ".join(f"{p.label}: {p.error}" for p in failed)
            + f" (exit status {EXIT_SOME_FAILED})",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return 0
