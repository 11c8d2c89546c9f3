"""`kvscope bench`: the article's prompt-length sweep, headless, with roofline overlay."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from bench.sweep_result import SweepConfig, SweepResult
from cli.measure import check_output_len, measure
from cli.result_files import result_files, say_problems
from cli.roofline import parse_int_list, parse_int_option
from cli.sweep_table import render_summary
from engine.errors import BadOption

if TYPE_CHECKING:
    from cli.result_files import ResultFile

EXIT_SOME_FAILED = 3


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
            "  kvscope bench --model Qwen/Qwen2.5-7B-Instruct --hardware l4   (on an L4)\n\n"
            "exit status: 0 when every length was measured, 3 when some failed (they are\n"
            "reported as failed points), 1 or 2 on errors before the sweep."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--prompt-lens",
        default="512,1024,2048,4096",
        metavar="N,N,...",
        help="prompt lengths in tokens (512,1024,2048,4096)",
    )
    p.add_argument(
        "--output-len", default="128", metavar="N", help="output tokens per request (128)"
    )
    p.add_argument("--runs", default="3", metavar="N", help="measured runs per length (3)")
    p.add_argument(
        "--warmup", default="1", metavar="N", help="warm-up requests before the sweep (1)"
    )
    p.add_argument(
        "--concurrency", default="1", metavar="N", help="requests sent at once in each run (1)"
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
    from cli.replay import add_record_arg

    add_attach_args(p)
    add_record_arg(p)
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
    config = SweepConfig(
        prompt_lens=tuple(parse_int_list(args.prompt_lens, "--prompt-lens")),
        output_len=parse_int_option(args.output_len, "--output-len", 1),
        runs=parse_int_option(args.runs, "--runs", 1),
        warmup=parse_int_option(args.warmup, "--warmup", 0),
        concurrency=parse_int_option(args.concurrency, "--concurrency", 1),
    )
    config.validate()
    return config


def run_bench(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.engine_choice import started_engine
    from cli.launch import int_flag, say
    from engine.vllm.options import gpu_present

    config = config_from_args(args)  # bad flags stop here, before a minute of engine start
    check_output_len(config, int_flag(engine_argv, "--max-model-len"))
    files = result_files(args)
    for f in files:
        f.check()
    if args.compare:
        if args.url:
            raise BadOption("--compare", "it restarts the engine with each config: not with --url")
        from cli.compare import report_compare, run_compare

        return report_compare(run_compare(args, config, engine_argv), args, args.json_path)
    result = SweepResult(config, complete=False)
    try:
        with started_engine(
            args,
            engine_argv,
            check=lambda flags: check_output_len(config, flags.max_model_len),
            tape=args.tape,
        ) as engine:
            hardware = None if args.no_roofline else args.hardware
            if engine.features.remote is not None:
                hardware = args.hardware  # this machine's CPU says nothing about the server's
            elif not args.no_roofline and hardware is None and not gpu_present():
                hardware = "cpu"
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
