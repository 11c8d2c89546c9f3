"""`kvscope bench`: the article's prompt-length sweep, headless, with roofline overlay; or,
with a list of concurrencies or request rates, load (cli/load_bench.py)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from bench.load_result import LoadResult
from bench.sweep_result import SweepConfig, SweepResult
from cli.measure import check_output_len, measure
from cli.result_files import result_files, say_problems
from cli.roofline import parse_int_list, parse_int_option
from cli.sweep_table import render_summary
from engine.errors import BadOption, KvscopeError

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from cli.result_files import ResultFile
    from engine.protocol import Engine
    from roofline.point_perf import PointRoofs

EXIT_SOME_FAILED = 3
DEFAULT_LENS = "512,1024,2048,4096"


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="prompt-length sweep: TTFT, ITL, TPOT, E2EL per length",
        usage="kvscope bench [options] [vLLM engine flags]",
        description=(
            "Measure TTFT, ITL, TPOT and end-to-end latency at each prompt length, like\n"
            "`vllm bench latency`, with exact-length synthetic prompts that ignore EOS.\n"
            "Each measured point is shown next to its roofline floor for the hardware.\n"
            "Any vLLM engine flag may follow (`kvscope engine-help` lists them)."
        ),
        epilog=(
            "examples:\n"
            "  kvscope bench\n"
            "  kvscope bench --prompt-lens 128,2048 --output-len 16 --runs 1 --json out.json\n"
            "  kvscope bench --model Qwen/Qwen2.5-7B-Instruct --hardware l4   (on an L4)\n"
            "  kvscope bench --concurrency 1,2,4,8 --prompt-lens 512 --output-len 64\n"
            "  kvscope bench --request-rate 1,2,4 --duration 30 --arrival gamma --burstiness 0.5\n"
            "  kvscope bench --find-max --goodput ttft:2000 tpot:100\n"
            "  kvscope bench --fake --concurrency 1,2,4 --prompt-lens 64 --output-len 16\n"
            "  kvscope bench --url http://127.0.0.1:8080 --turns 4 --sessions 4 --output-len 32\n"
            "  kvscope bench --turns 4 --sessions 4 --compare-urls "
            "rr=http://127.0.0.1:8080,ca=http://127.0.0.1:8081\n\n"
            "exit status: 0 when every length was measured, 3 when some failed (they are\n"
            "reported as failed points), 1 or 2 on errors before the sweep."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--prompt-lens",
        metavar="N,N,...",
        help="prompt lengths in tokens (512,1024,2048,4096; under load, one length: 512)",
    )
    p.add_argument(
        "--output-len", default="128", metavar="N", help="output tokens per request (128)"
    )
    # No default here: given in load mode it is refused (a load point is --num-prompts).
    p.add_argument("--runs", metavar="N", help="measured runs per length (3)")
    p.add_argument(
        "--warmup", default="1", metavar="N", help="warm-up requests before the sweep (1)"
    )
    p.add_argument(
        "--concurrency",
        metavar="N[,N...]",
        help="requests sent at once in each run (1); a list (1,2,4,8) measures load: "
        "that many users, each sending its next request when its last one ends",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        metavar="FILE",
        help="write the results, with per-request detail, as JSON",
    )
    p.add_argument("--csv", dest="csv_path", metavar="FILE", help="write one row per length as CSV")
    p.add_argument(
        "--hardware",
        metavar="KEY",
        help="roofline profile for the floors: cpu (this machine, calibrated), l4, "
        "a100-80gb, ... (default: cpu without a GPU; none with one)",
    )
    p.add_argument("--no-roofline", action="store_true", help="do not compute floors")
    from cli.attach import add_attach_args
    from cli.session_tape import add_record_arg

    add_attach_args(p)
    add_record_arg(p)
    p.add_argument(
        "--fake", action="store_true", help="the built-in scripted engine (no vLLM; for trying)"
    )
    from cli.load_bench import add_load_args

    add_load_args(p)
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("FLAGS_A", "FLAGS_B"),
        help=(
            "A/B: the same sweep on two engine configs, one after the other, e.g. "
            '--compare "--max-num-batched-tokens 256" "--max-num-batched-tokens 2048"; '
            "prints both, the B/A ratios, and overlaid charts"
        ),
    )
    return p


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    from bench.load_runner import MAX_CONCURRENCY

    concurrency = parse_int_option(args.concurrency or "1", "--concurrency", 1)
    if concurrency > MAX_CONCURRENCY:
        raise BadOption(
            "--concurrency", f"{concurrency:,} is past the limit of {MAX_CONCURRENCY:,}"
        )
    config = SweepConfig(
        prompt_lens=tuple(
            parse_int_list(
                DEFAULT_LENS if args.prompt_lens is None else args.prompt_lens, "--prompt-lens"
            )
        ),
        output_len=parse_int_option(args.output_len, "--output-len", 1),
        runs=parse_int_option("3" if args.runs is None else args.runs, "--runs", 1),
        warmup=parse_int_option(args.warmup, "--warmup", 0),
        concurrency=concurrency,
        **({} if args.seed is None else {"seed": parse_int_option(args.seed, "--seed", 0)}),
    )
    config.validate()
    return config


def run_bench(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.launch import int_flag, say
    from cli.load_bench import run_multi_turn_bench, wants_load, wants_multi_turn

    if wants_multi_turn(args):
        return run_multi_turn_bench(args, engine_argv, bench_engine)
    if wants_load(args):
        return run_load_bench(args, engine_argv)
    if args.arrival or args.burstiness:
        which = "--arrival" if args.arrival else "--burstiness"
        raise BadOption(which, "it shapes an open loop's arrivals: give --request-rate")
    config = config_from_args(args)  # bad flags stop here, before a minute of engine start
    check_output_len(config, int_flag(engine_argv, "--max-model-len"))
    files = result_files(args)
    for f in files:
        f.check()
    if args.compare:
        if args.url or args.fake:
            which = "--url" if args.url else "--fake"
            raise BadOption(
                "--compare", f"it restarts the engine with each config: not with {which}"
            )
        from cli.compare import report_compare, run_compare

        return report_compare(run_compare(args, config, engine_argv), args, args.json_path)
    result = SweepResult(config, complete=False)
    try:
        with bench_engine(
            args, engine_argv, check=lambda flags: check_output_len(config, flags.max_model_len)
        ) as engine:
            hardware = roofline_hardware(args, engine)
            result.roofs = bench_roofs(args, engine, hardware)
            measure(engine, config, result, files, hardware=hardware)
    except KeyboardInterrupt:
        # Stopped half-way: what was measured is already in the files; show it too.
        if result.points:
            render_summary(result, Console(file=sys.stdout, width=120))
            kept = " and ".join(str(f.written_to) for f in files if f.written_to)
            say(
                f"the sweep stopped after {len(result.points)} of {len(config.prompt_lens)} "
                "lengths" + (f"; they are in {kept}" if kept else "")
            )
        say_problems(files)
        raise
    return report(result, files)


def report(result: SweepResult, files: list[ResultFile]) -> int:
    """The table on stdout, whatever happened to the files; then what went wrong."""
    render_summary(result, Console(file=sys.stdout, width=120))
    seed = result.config.seed
    print(f"Prompts were drawn from seed {seed}: --seed {seed} repeats them.")
    say_problems(files)
    failed = [p for p in result.points if not p.ok]
    if failed:
        print(
            f"kvscope: {len(failed)} of {len(result.points)} lengths failed: "
            + "; ".join(f"{p.prompt_len}: {p.error}" for p in failed),
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return 0


def bench_engine(
    args: argparse.Namespace,
    engine_argv: list[str],
    *,
    check: Callable[[argparse.Namespace], None] | None,
) -> AbstractContextManager[Engine]:
    """The engine the flags ask for (`--fake`, `--url` or vLLM, as cli/engine_choice.py
    chooses), started, taped with --tape, always stopped after."""
    from cli.engine_choice import started_engine

    return started_engine(args, engine_argv, check=check, tape=args.tape)


def roofline_hardware(args: argparse.Namespace, engine: Engine) -> str | None:
    """The profile the floors come from: the asked one; this CPU for an in-process engine
    without a GPU; none for a server unless asked (this CPU says nothing about it)."""
    from engine.vllm.options import gpu_present

    if engine.features.remote is not None:
        return str(args.hardware) if args.hardware else None
    if args.no_roofline or args.fake:
        return None
    if args.hardware is None and not gpu_present():
        return "cpu"
    return str(args.hardware) if args.hardware else None


def bench_roofs(args: argparse.Namespace, engine: Engine, hardware: str | None) -> PointRoofs | str:
    """The roofs each point's share is of, or why there are none: the live roofline's
    (`machine_roofs`: this CPU's calibration, the fake's set machine, an NVML-named GPU's
    profile) for an in-process engine, whose steps run here even when a GPU is emulated;
    for a server, the --hardware profile, since nothing here knows its machine."""
    from roofline.hardware import load_profile
    from roofline.point_perf import PointRoofs
    from tui.roofline_figure import machine_roofs

    card = engine.card
    if engine.features.remote is not None:
        if not args.hardware:
            return (
                "the server's machine is not known here: give --hardware KEY (l4, "
                "h100-sxm, ...) for each point's share of its roofs"
            )
        try:
            p = load_profile(str(args.hardware), option="--hardware")
        except KvscopeError as exc:
            return exc.plain()
        return PointRoofs(p.name, p.peak_bf16_flops, p.mem_bandwidth_bytes_s)
    if card is None:
        return "the engine has no model card, so its machine is not known"
    roofs = machine_roofs(card)
    if isinstance(roofs, str) and card.device == "cpu" and hardware == "cpu":
        # Uncalibrated: the floors measure this CPU (load_profile caches it), and then the
        # live roofline's source has it too.
        try:
            load_profile("cpu", option="--hardware")
        except KvscopeError as exc:
            return exc.plain()
        roofs = machine_roofs(card)
    if isinstance(roofs, str):
        return roofs
    return PointRoofs(roofs.name, roofs.peak_flops, roofs.bandwidth)


def run_load_bench(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.launch import int_flag, say
    from cli.load_bench import (
        check_load_output_len,
        load_config_from_args,
        load_files,
        measure_load,
        report_load,
    )

    if args.compare:
        raise BadOption("--compare", "it compares prompt-length sweeps, not load runs")
    config = load_config_from_args(args)  # every bad flag stops here, before any engine
    check_load_output_len(config, int_flag(engine_argv, "--max-model-len"))
    files = load_files(args)
    for f in files:
        f.check()
    result = LoadResult(config, complete=False)
    try:
        with bench_engine(
            args,
            engine_argv,
            check=lambda flags: check_load_output_len(config, flags.max_model_len),
        ) as engine:
            hardware = roofline_hardware(args, engine)
            result.roofs = bench_roofs(args, engine, hardware)
            measure_load(engine, config, result, files, hardware=hardware)
    except KeyboardInterrupt:
        if result.points:
            report_load(result, files)
            kept = " and ".join(str(f.written_to) for f in files if f.written_to)
            say(
                f"the load stopped after {len(result.points)} point(s)"
                + (f"; they are in {kept}" if kept else "")
            )
        raise
    return report_load(result, files)
