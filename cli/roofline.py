"""`kvscope roofline`: the first-principles floors for a model on a GPU, as a table.

Only `add_roofline_parser` and `run_roofline` are meant for the main CLI; `parse_int_list`
is shared with other subcommands that take comma lists.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from engine.byte_size import figure, in_unit
from engine.errors import BadOption, KvscopeError
from roofline.batched import BatchedReport, batched_report
from roofline.floors import RooflineReport, predict
from roofline.hardware import known_gpus, known_models, load_geometry, load_profile

if TYPE_CHECKING:
    import argparse

    from roofline.point_perf import PointRoofs
    from tui.bench_roofline_plot import RooflineRow

DEFAULT_GPU = "l4"
DEFAULT_MODEL = "qwen2.5-7b-instruct"
DEFAULT_PROMPT_LENS = "512,1024,2048,4096"


def parse_int_list(text: str, option_name: str, *, minimum: int = 1) -> list[int]:
    """Parse a comma list: "512,1024, 2048" -> [512, 1024, 2048].

    Raises BadOption naming `option_name` for anything else, and for values below
    `minimum`.

    Empty items are errors rather than skipped: "512,,1024" is more likely a typo than
    a wish.
    """
    items = [part.strip() for part in str(text).split(",")]
    if not any(items):
        raise BadOption(option_name, "give at least one number, e.g. 512,1024")
    values = []
    for item in items:
        if not item:
            raise BadOption(option_name, f"empty item in {text!r}")
        try:
            value = int(item)
        except ValueError:
            raise BadOption(option_name, f"{item!r} is not a whole number") from None
        if value < minimum:
            raise BadOption(option_name, f"{value} is below the minimum of {minimum}")
        values.append(value)
    return values


def parse_int_option(value: Any, option_name: str, minimum: int) -> int:
    # Options arrive as text from argparse (so errors get our one-line format, not
    # argparse's usage dump) and as ints from code that builds a Namespace itself.
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise BadOption(option_name, f"{value!r} is not a whole number") from None
    if number < minimum:
        raise BadOption(option_name, f"must be at least {minimum} (got {number})")
    return number


def _float_option(value: Any, option_name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BadOption(option_name, f"{value!r} is not a number") from None


def add_roofline_parser(subparsers: Any) -> None:
    """Add the `roofline` subcommand to an argparse subparsers object.

    Sets `handler=run_roofline` as a default, for main CLIs that dispatch that way.
    """
    parser = subparsers.add_parser(
        "roofline",
        help="first-principles TTFT/ITL floors and KV capacity of a model on a GPU",
        description=(
            "Predict, from the model's geometry and the GPU's peak numbers alone, the "
            "fastest possible time to first token (prefill is compute-bound), the fastest "
            "possible inter-token latency (decode is memory-bound), and how much KV cache "
            "vLLM would get. Use --gpu cpu to measure this machine instead."
        ),
    )
    parser.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        help=f"hardware profile: {', '.join(known_gpus())} (default: {DEFAULT_GPU})",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=(
            f"a shipped geometry ({', '.join(known_models())}) or a local model folder / "
            f"config.json (default: {DEFAULT_MODEL})"
        ),
    )
    parser.add_argument(
        "--prompt-lens",
        default=DEFAULT_PROMPT_LENS,
        help=f"comma-separated prompt lengths in tokens (default: {DEFAULT_PROMPT_LENS})",
    )
    parser.add_argument(
        "--output-len", default="128", help="output tokens per request (default: 128)"
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        default="0.9",
        help="fraction of GPU memory vLLM may use, as vLLM's flag (default: 0.9)",
    )
    parser.add_argument(
        "--batch",
        metavar="B,B,...",
        help="also predict batched decode at these batch sizes (e.g. 1,8,32,128), at each "
        "prompt length plus half the output",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead")
    parser.add_argument(
        "--plot",
        metavar="FILE.json",
        help="draw a saved `kvscope bench --json` result's points under the roofs it was "
        "measured against (each point's prefill and decode steps apart), and their table",
    )
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="with --gpu cpu: measure again instead of using the cached calibration",
    )
    parser.set_defaults(handler=run_roofline)


def build_report(args: argparse.Namespace) -> RooflineReport:
    """Validate the parsed options and compute the report; raises KvscopeError."""
    prompt_lens = parse_int_list(getattr(args, "prompt_lens", DEFAULT_PROMPT_LENS), "--prompt-lens")
    output_len = parse_int_option(getattr(args, "output_len", 128), "--output-len", minimum=1)
    util = _float_option(getattr(args, "gpu_memory_utilization", 0.9), "--gpu-memory-utilization")
    geom = load_geometry(getattr(args, "model", DEFAULT_MODEL), option="--model")
    hw = load_profile(
        getattr(args, "gpu", DEFAULT_GPU),
        recalibrate=bool(getattr(args, "recalibrate", False)),
        option="--gpu",
        # Calibration takes seconds: say what it measures while it does.
        progress=lambda stage: print(f"kvscope: calibrating: {stage}", file=sys.stderr),
    )
    return predict(geom, hw, prompt_lens, output_len=output_len, util=util)


def run_roofline(args: argparse.Namespace) -> int:
    """Print the report (a table, or JSON with --json). 0 on success; 2 with one
    `kvscope: ...` line on stderr for a bad option."""
    if getattr(args, "plot", None):
        return run_plot(str(args.plot))
    try:
        batches = _batches(getattr(args, "batch", None))
        report = build_report(args)
    except KvscopeError as exc:
        print(f"kvscope: {exc.plain()}", file=sys.stderr)
        return 2
    batched = batched_reports(report, batches) if batches else []
    if getattr(args, "json", False):
        data = report.to_dict()
        if batched:
            data["batched"] = [b.to_dict() for b in batched]
        print(json.dumps(data, indent=2))
    else:
        render_report(report)
        if batched:
            render_batched(batched)
    return 0


def _batches(text: str | None) -> list[int]:
    if text is None:
        return []
    batches = parse_int_list(text, "--batch")
    too_big = [b for b in batches if b > 1_000_000]
    if too_big:
        raise BadOption("--batch", f"{too_big[0]:,} is past the limit of 1,000,000")
    return batches


def batched_reports(report: RooflineReport, batches: list[int]) -> list[BatchedReport]:
    """Batched decode at each prompt length's midpoint context, for the report's model,
    hardware, utilization and block size."""
    return [
        batched_report(
            report.geometry,
            report.hardware,
            batches,
            p.prompt_len + report.output_len // 2,
            util=report.gpu_memory_utilization,
            block_size=report.block_size,
        )
        for p in report.predictions
    ]


def render_batched(reports: list[BatchedReport]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    table = Table(title="Batched decode: one step of b requests at context c (floors)")
    for col in ("context", "batch", "step ms", "tokens/s", "bound", "fits pool?"):
        table.add_column(col, justify="right")
    for r in reports:
        for s in r.steps:
            table.add_row(
                f"{s.context:,}",
                f"{s.batch:,}",
                f"{s.step_s * 1e3:,.2f}",
                f"{s.tokens_per_s:,.0f}",
                s.bound,
                "yes" if s.fits else "[red]no[/]",
            )
    console.print(table)
    for r in reports:
        console.print(r.sentence())
    console.print(
        "step = max((weights + b x KV bytes at c) / bandwidth, b x decode FLOPs at c / peak); "
        "tokens/s = b / step. 'fits pool?' = b requests of c tokens fit in the KV pool.",
        style="dim",
    )


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.3g} {prefix}{unit}"
    return f"{value:,.3g} {unit}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def render_report(report: RooflineReport) -> None:
    """The report as a rich table with a header, on stdout."""
    from rich.console import Console
    from rich.table import Table

    # Not a terminal (a pipe, a test): a fixed, wide width so no number is cut.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    g, hw = report.geometry, report.hardware
    console.print(
        f"[bold]{g.name}[/]: {_params(g.num_params)} params, "
        f"{in_unit(report.weight_bytes, 'GB', 2)} of weights at {g.dtype_bytes} bytes each; "
        f"KV {report.kv_bytes_per_token:,} bytes/token "
        f"(2 x {g.num_layers} layers x {g.num_kv_heads} KV heads x {g.head_dim} x "
        f"{g.dtype_bytes} bytes)"
    )
    console.print(
        f"[bold]{hw.name}[/]: {_si(hw.peak_bf16_flops, 'FLOP/s')} dense peak, "
        f"{_si(hw.mem_bandwidth_bytes_s, 'B/s')}, {in_unit(hw.memory_bytes, 'GiB', 2)}"
    )
    if not report.weights_fit:
        console.print(
            f"[bold red]The weights ({in_unit(report.weight_bytes, 'GiB', 2)}) plus the "
            f"activation reserve do not fit in {report.gpu_memory_utilization:.0%} of "
            "this memory: vLLM would not start.[/]"
        )
    else:
        console.print(
            f"KV pool at gpu_memory_utilization {report.gpu_memory_utilization:g}: "
            f"{in_unit(report.kv_pool_bytes, 'GiB', 2)} = {report.kv_pool_tokens:,} tokens "
            f"(after {in_unit(report.activation_reserve_bytes, 'GiB', 2)} kept for activations "
            f"and overhead); longest request {report.max_single_prompt_tokens:,} tokens"
        )
        if not report.starts_at_default_max_model_len:
            console.print(
                f"[yellow]The pool is smaller than the model's context "
                f"({g.max_position_embeddings:,}): vLLM refuses to start unless "
                f"--max-model-len is at most {report.kv_pool_tokens:,}.[/]"
            )

    table = Table(title=f"Floors per request, {report.output_len} output tokens")
    table.add_column("prompt", justify="right")
    table.add_column("prefill TFLOP", justify="right")
    table.add_column("TTFT floor ms", justify="right")
    table.add_column("ITL floor ms", justify="right")
    table.add_column("prompt KV MiB", justify="right")
    table.add_column("fits?", justify="center")
    table.add_column("at once", justify="right")
    for p in report.predictions:
        bound = "" if p.ttft_bound == "compute" else " (mem)"
        table.add_row(
            f"{p.prompt_len:,}",
            f"{p.prefill_flops / 1e12:,.2f}",
            f"{p.ttft_floor_s * 1e3:,.1f}{bound}",
            f"{p.itl_floor_s * 1e3:,.2f}",
            figure(p.kv_bytes, "MiB", 1, grouped=True),
            "yes" if p.fits else "[red]no[/]",
            f"{p.concurrent:,}",
        )
    console.print(table)
    console.print(
        "Floors are at 100% of peak: TTFT = prefill FLOPs / peak FLOP/s (or one pass over "
        "the weights, if longer); ITL = (weights + KV) / bandwidth, at the middle of the "
        "output. 'at once' = requests of prompt + output tokens whose KV fits in the pool.",
        style="dim",
    )


# -- roofline --plot: a saved bench's points under its roofs ---------------------------------


def saved_rooflines(
    path: str,
) -> tuple[list[RooflineRow], PointRoofs | str | None]:
    """A saved bench result's points (label, roofline figures) and its roofs; raises
    KvscopeError in one sentence naming the file for a file that is not one, or holds no
    point with counts."""
    from pathlib import Path

    from bench.sweep_files import SweepFileError, load_saved
    from tui.bench_roofline_plot import saved_rows, undrawable

    rows, roofs = saved_rows(load_saved(Path(path)))
    why = undrawable(rows)
    if why is not None:
        raise SweepFileError(path, why)
    return rows, roofs


def run_plot(path: str) -> int:
    """`roofline --plot FILE`: the plot and the table of figures; 2 with one `kvscope:`
    line on stderr for a file that cannot be drawn."""
    from rich.console import Console

    from cli.sweep_table import render_roofline
    from roofline.point_perf import PointRoofs
    from tui.bench_roofline_plot import roofline_plot

    try:
        rows, roofs = saved_rooflines(path)
    except KvscopeError as exc:
        print(f"kvscope: {exc.plain()}", file=sys.stderr)
        return 2
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    known = roofs if isinstance(roofs, PointRoofs) else None
    try:
        plot = roofline_plot(rows, known, width=min(console.width, 120))
    except Exception as exc:  # plotext on a terminal it cannot draw on: the table still says it
        plot = ""
        print(f"kvscope: no plot ({exc}); the figures follow as a table", file=sys.stderr)
    if plot:
        console.file.write(plot + "\n")
        if known is not None:
            console.print(
                f"Roofs: {known.name}: the slope is {_si(known.bandwidth, 'B/s')} "
                f"(memory-bound left of the ridge), the flat roof "
                f"{_si(known.peak_flops, 'FLOP/s')} (compute-bound right of it); they meet "
                f"at the ridge, {known.ridge:,.1f} FLOP/byte."
            )
    render_roofline(rows, roofs, console)
    return 0
