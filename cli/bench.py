"""`kvscope bench`: the article's prompt-length sweep, headless, with roofline overlay."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from bench.sweep import FloorFn, SweepConfig, SweepPoint, SweepResult, make_floors, run_sweep
from cli.roofline import parse_int_list, parse_int_option
from engine.errors import BadOption, KvscopeError

if TYPE_CHECKING:
    from collections.abc import Callable

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


def render_summary(result: SweepResult, console: Console) -> None:
    table = Table(
        title=f"kvscope bench: {result.config.output_len} output tokens, "
        f"{result.config.runs} run(s), concurrency {result.config.concurrency}"
    )
    for col in (
        "prompt",
        "mean TTFT ms",
        "median TTFT",
        "p99 TTFT",
        "median ITL ms",
        "p99 ITL",
        "mean TPOT",
        "E2EL ms",
        "out tok/s",
        "TTFT % floor",
        "ITL % floor",
    ):
        table.add_column(col, justify="right")
    for p in result.points:
        if not p.ok:
            reason = (p.error or "").split(":")[0]
            table.add_row(f"{p.prompt_len:,}", "[red]failed[/]", f"[red]{reason}[/]", *[""] * 8)
            continue

        def f(key: str, fmt: str = "{:.1f}", p: SweepPoint = p) -> str:
            v = p.value(key)
            return fmt.format(v) if v is not None else "-"

        table.add_row(
            f"{p.prompt_len:,}",
            f("mean_ttft_ms"),
            f("median_ttft_ms"),
            f("p99_ttft_ms"),
            f("median_itl_ms"),
            f("p99_itl_ms"),
            f("mean_tpot_ms"),
            f("mean_e2el_ms", "{:.0f}"),
            f("output_throughput"),
            f("ttft_pct_of_floor", "{:.0f}%"),
            f("itl_pct_of_floor", "{:.0f}%"),
        )
    console.print(table)
    ok = [p for p in result.points if p.ok]
    if len(ok) >= 2:
        first, last = ok[0], ok[-1]
        ttft_ratio = (last.value("mean_ttft_ms") or 0.0) / max(
            first.value("mean_ttft_ms") or 0.0, 1e-9
        )
        itl_ratio = (last.value("median_itl_ms") or 0.0) / max(
            first.value("median_itl_ms") or 0.0, 1e-9
        )
        console.print(verdict(last.prompt_len / first.prompt_len, ttft_ratio, itl_ratio))
        busy = busy_host()
        if busy:
            console.print(busy)
        console.file.write(charts(result, width=min(console.width, 100)) + "\n")


def verdict(prompt_ratio: float, ttft_ratio: float, itl_ratio: float) -> str:
    """What the sweep's own numbers show, in one sentence: never a fixed text."""
    head = f"prompt x{prompt_ratio:.0f}: TTFT x{ttft_ratio:.1f}, median ITL x{itl_ratio:.2f}. "
    ttft_grew = ttft_ratio >= max(1.5, 0.5 * prompt_ratio)
    itl_flat = itl_ratio <= 1.5
    if ttft_grew and itl_flat:
        return head + (
            "TTFT grew with the prompt while ITL stayed nearly flat: prefill is "
            "compute-bound and decode memory-bound, as in the reference article."
        )
    if ttft_grew:
        return head + (
            "TTFT grew with the prompt, but ITL grew too: decode is not flat here (long "
            "contexts, or a busy host slowing some steps)."
        )
    if itl_flat:
        return head + (
            "TTFT grew less than the prompt: fixed costs (a network round trip, a small "
            "model, queueing) outweigh the prefill itself at these lengths."
        )
    return head + "Neither finding shows clearly in these numbers; a busy host is likely."


def busy_host() -> str:
    """A warning when this machine was busier than its cores while measuring, else ""."""
    import os

    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load <= cores:
        return ""
    return (
        f"Note: this host was busy while measuring (load {load:.1f} on {cores} cores): "
        "other work shared the CPU, so the ratios are noisy. Measure again on a quiet host."
    )


def charts(result: SweepResult, width: int = 100, height: int = 14) -> str:
    import plotext as plt

    ok = [p for p in result.points if p.ok]
    xs = [p.prompt_len for p in ok]
    out = []
    for key, floor_key, title in (
        ("mean_ttft_ms", "ttft_floor_ms", "TTFT (ms) vs prompt length"),
        ("median_itl_ms", "itl_floor_ms", "median ITL (ms) vs prompt length"),
    ):
        plt.clf()
        plt.plotsize(width, height)
        plt.theme("clear")
        plt.plot(xs, [p.value(key) or 0.0 for p in ok], marker="braille", label="measured")
        if all(p.value(floor_key) is not None for p in ok):
            # Another glyph than the measurement's: the charts are often read without colour.
            plt.plot(xs, [p.value(floor_key) or 0.0 for p in ok], marker="x", label="floor")
        plt.title(title)
        plt.ylim(0, None)
        out.append(plt.build())
    # Plain text: the charts go to files and pipes as often as to terminals.
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out))


class ResultFile:
    """One --json or --csv output, written again after every point, so a sweep that is
    stopped or crashes keeps what it measured.

    Each write goes to a temporary file beside the target and is renamed over it, so a
    reader never sees half a file. If the target cannot be written after all (a full
    disk, a folder removed mid-sweep), the results go to the temp folder instead, and
    `problem()` says where.
    """

    def __init__(self, option: str, path: str, render: Callable[[SweepResult], str]) -> None:
        self.option = option
        self.path = Path(path)
        self.render = render
        self.written_to: Path | None = None
        self.error: str | None = None

    def check(self) -> None:
        """Before the engine starts: can a file be created where the user asked?"""
        if self.path.is_dir():
            raise BadOption(self.option, f"{self.path} is a folder, not a file")
        folder = self.path.parent
        if not folder.is_dir():
            raise BadOption(self.option, f"the folder {folder} does not exist")
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{self.path.name}.", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise BadOption(
                self.option, f"cannot write in {folder} ({exc.strerror or exc})"
            ) from None

    def write(self, result: SweepResult) -> None:
        """Never raises: losing the file must not lose the sweep."""
        text = self.render(result)
        if self.error is None:
            try:
                _replace_atomically(self.path, text)
                self.written_to = self.path
                return
            except OSError as exc:
                self.error = exc.strerror or str(exc)
        fallback = Path(tempfile.gettempdir()) / f"kvscope-bench-{os.getpid()}{self.path.suffix}"
        try:
            _replace_atomically(fallback, text)
            self.written_to = fallback
        except OSError:
            self.written_to = None

    def problem(self) -> str | None:
        if self.error is None:
            return None
        if self.written_to is None:
            return (
                f"could not write {self.path} ({self.error}), nor a copy in the temp "
                "folder: the table on stdout is all that is kept"
            )
        return f"could not write {self.path} ({self.error}); the results are in {self.written_to}"


def _replace_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def result_files(args: argparse.Namespace) -> list[ResultFile]:
    files = []
    if args.json_path:
        files.append(ResultFile("--json", args.json_path, SweepResult.to_json))
    if args.csv_path:
        files.append(ResultFile("--csv", args.csv_path, SweepResult.to_csv))
    return files


def _say_problems(files: list[ResultFile]) -> None:
    from cli.launch import say

    for f in files:
        problem = f.problem()
        if problem:
            say(problem)


def check_output_len(config: SweepConfig, max_model_len: int | None) -> None:
    if max_model_len and config.output_len >= max_model_len:
        raise BadOption(
            "--output-len",
            f"{config.output_len:,} is not below the context limit (max_model_len) of "
            f"{max_model_len:,}, which the prompt and the output share",
        )


def measure(
    engine: Any,
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


def run_bench(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.launch import int_flag, running_engine, say
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
    from cli.replay import open_recorder, recorded

    recorder = open_recorder(args.tape) if args.tape else None  # said before any engine
    result = SweepResult(config, complete=False)
    try:
        if args.url:
            from cli.attach import remote_engine

            engine_cm: Any = remote_engine(args, engine_argv)
        else:
            engine_cm = running_engine(
                engine_argv, check=lambda flags: check_output_len(config, flags.max_model_len)
            )
        with engine_cm as inner, recorded(inner, recorder) as engine:
            hardware = None if args.no_roofline else args.hardware
            if args.url:
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
        _say_problems(files)
        raise
    return report(result, files)


def report(result: SweepResult, files: list[ResultFile]) -> int:
    """The table on stdout, whatever happened to the files; then what went wrong."""
    render_summary(result, Console(file=sys.stdout, width=120))
    _say_problems(files)
    failed = [p for p in result.points if not p.ok]
    if failed:
        print(
            f"kvscope: {len(failed)} of {len(result.points)} lengths failed: "
            + "; ".join(f"{p.prompt_len}: {p.error}" for p in failed),
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return 0
