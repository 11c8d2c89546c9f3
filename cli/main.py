"""The `kvscope` command: the playground by default, and headless subcommands.

Only argparse lives at module level, so `kvscope --help` answers at once; vLLM and Textual
are imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

DESCRIPTION = """\
kvscope: see what an LLM inference engine (vLLM) does with every token.

With no subcommand it opens the playground: a chat whose replies stream token by token
beside live plots of every token's latency (ITL), time to first token (TTFT), KV-cache
usage and the KV block map, plus a prompt-length slider that walks into the walls
(context limit, KV pool, an emulated GPU's memory).

By default it runs SmolLM2-135M-Instruct, prepared offline from a PyPI package, on the
CPU. Any vLLM engine flag is accepted as is, e.g. --model Qwen/Qwen2.5-7B-Instruct
--max-model-len 8192 on a GPU box (`kvscope engine-help` lists them all).

kvscope's defaults: on the CPU, --enforce-eager, a 256 MiB KV pool and a 0.5 memory
fraction. The embedded model on a GPU gets the same 256 MiB pool (not 0.92 of the GPU)
and a --gpu-memory-utilization of its own size (4 GiB plus the pool), so it starts beside
a `vllm serve`; --kv-cache-memory-bytes, --num-gpu-blocks-override or
--gpu-memory-utilization replace them. With --model, a GPU keeps vLLM's defaults.
`kvscope doctor` says what this box gives.
"""

EXAMPLES = """\
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
            f"kvscope [options] [vLLM engine flags]\n       kvscope {{{','.join(COMMANDS)}}} ..."
        ),
        description=DESCRIPTION,
        epilog=(
            "subcommands (each has its own --help):\n"
            + "".join(f"  {c.name:<15}{c.summary}\n" for c in COMMANDS.values())
            + "\n"
            + EXAMPLES
        ),
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
    from cli.session_tape import add_tape_args

    add_tape_args(p)
    p.add_argument("--version", action="version", version=version_line())
    return p


def version_line() -> str:
    """kvscope's version and vLLM's, from package metadata (no import of vLLM), and whether
    kvscope was checked against that vLLM."""
    from importlib.metadata import PackageNotFoundError, version

    from engine.vllm import versions

    try:
        ours = version("kvscope")
    except PackageNotFoundError:
        ours = "unknown (not installed)"
    return f"kvscope {ours}\n{versions.version_line()}"


def main(argv: Sequence[str] | None = None) -> int:
    from cli.launch import STOP, say
    from engine.errors import KvscopeError

    args_in = list(sys.argv[1:] if argv is None else argv)
    if sys.stdin is None:
        # Started with stdin closed (`<&-`): reading it reads nothing, in every command
        # (`--prompt-file -` then says stdin holds no text), and the playground says so.
        from cli.terminal import stdin_was_closed

        stdin_was_closed()
    command = COMMANDS.get(args_in[0]) if args_in else None
    if command is None and args_in and not args_in[0].startswith("-"):
        # The playground takes flags only: a word first is a command, or a typo of one.
        say(unknown_command(args_in[0]))
        return 2
    stops = command.stops if command else "the engine"  # the playground's engine
    if stops:
        STOP.what = stops
        STOP.install()
    try:
        code = command.run(args_in) if command else _playground(args_in)
        # A signal that came while the engine was already stopping was not raised.
        return STOP.exit_code if stops and STOP.signum else code
    except KeyboardInterrupt:
        if not stops or STOP.signum is None:
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
        if stops:
            STOP.uninstall()


def unknown_command(word: str) -> str:
    """One line for `kvscope foo`: what the commands are, and the closest one."""
    import difflib

    close = difflib.get_close_matches(word, list(COMMANDS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"Unknown command: {word!r}{hint}. The commands are {', '.join(COMMANDS)}; with "
        "no command (only flags) kvscope opens the playground: kvscope --help."
    )


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


# -- the subcommands ----------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """A subcommand: its line in `kvscope --help`, and how it runs."""

    name: str
    summary: str
    run: Callable[[list[str]], int]
    """Parses the words from the command's name on, and runs it. The command's module is
    imported only here, so that `kvscope --help` answers at once."""
    stops: str | None = None
    """What Ctrl-C must stop cleanly while the command runs (None: nothing, it just ends)."""


# In the order `kvscope --help` lists them.
COMMANDS: dict[str, Command] = {}


def subcommand(
    name: str, summary: str, *, stops: str | None = None
) -> Callable[[Callable[[list[str]], int]], Callable[[list[str]], int]]:
    """Adds the function below to COMMANDS: a new command is one such function."""

    def add(run: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
        COMMANDS[name] = Command(name, summary, run, stops)
        return run

    return add


_ATTACH_ONLY = (
    ("api_key", "--api-key"),
    ("served_model_name", "--served-model-name"),
    ("tokenizer", "--tokenizer"),
    ("router_metrics", "--router-metrics"),
)


def refuse_attach_flags(args: argparse.Namespace) -> None:
    """A flag for attaching to a server, given with no server to attach to, refused: the
    engine kvscope starts here (or the fake) would never see it, and a run would measure
    what was not asked. --served-model-name and --tokenizer are vLLM's names too, but
    kvscope's attach flags take them, so they never reach an engine started here."""
    if any(
        getattr(args, name, None)
        for name in ("url", "replica", "prefill", "decode", "compare_urls")
    ):
        return
    given = [flag for name, flag in _ATTACH_ONLY if getattr(args, name, None) is not None]
    timeout = getattr(args, "timeout", None)
    if timeout is not None:
        from engine.remote.timeouts import DEFAULT_TIMEOUTS

        given += [] if timeout is DEFAULT_TIMEOUTS else ["--timeout"]
    kv_events = getattr(args, "kv_events", "auto")
    given += [] if kv_events in (None, "auto") else ["--kv-events"]
    if given:
        from engine.errors import BadOption

        raise BadOption(
            given[0],
            "it is for attaching to a running server: give --url URL (or --replica URL); "
            "without one kvscope starts its own engine, which this flag never reaches",
        )


def refuse_unknown_flags(args: argparse.Namespace, engine_argv: list[str]) -> None:
    """A flag neither kvscope's parser nor any vLLM source names, refused at once: vLLM's
    own parser would say the same after 10-20 s of importing vLLM and torch. Only where
    the flags go to an in-process vLLM: --fake, --url, --replica and --compare-urls say
    in their own words that engine flags do not apply to them."""
    if not engine_argv or any(
        getattr(args, name, None)
        for name in ("fake", "url", "replica", "prefill", "decode", "compare_urls")
    ):
        return
    from engine.errors import UnknownFlag
    from engine.vllm.flag_names import surely_unknown

    unknown = surely_unknown(engine_argv)
    if unknown is not None:
        raise UnknownFlag(unknown)


def _parser(add_parser: Callable[[Any], object]) -> OneLineParser:
    """`kvscope` with the one subcommand `add_parser` adds, so that its --help and its
    errors say `kvscope NAME`."""
    parser = OneLineParser(prog="kvscope")
    add_parser(parser.add_subparsers(dest="command"))
    return parser


@subcommand(
    "generate",
    "one request, headless: TTFT, every ITL, step samples (--json)",
    stops="the engine",
)
def _generate(argv: list[str]) -> int:
    from cli.generate import add_generate_parser, run_generate

    args, engine_argv = _parser(add_generate_parser).parse_known_args(argv)
    refuse_attach_flags(args)
    refuse_unknown_flags(args, engine_argv)
    return run_generate(args, engine_argv)


@subcommand(
    "bench", "prompt-length sweep like `vllm bench`: table, charts, JSON/CSV", stops="the engine"
)
def _bench(argv: list[str]) -> int:
    from cli.bench import add_bench_parser, run_bench

    args, engine_argv = _parser(add_bench_parser).parse_known_args(argv)
    refuse_attach_flags(args)
    refuse_unknown_flags(args, engine_argv)
    return run_bench(args, engine_argv)


@subcommand("roofline", "predicted TTFT/ITL floors and KV capacity for a model on a GPU")
def _roofline(argv: list[str]) -> int:
    from cli.roofline import add_roofline_parser, run_roofline

    return run_roofline(_parser(add_roofline_parser).parse_args(argv))


@subcommand(
    "prepare-model",
    "convert the embedded default model now (otherwise done on first use)",
    stops="the conversion",
)
def _prepare_model(argv: list[str]) -> int:
    from cli.prepare_model import add_prepare_model_parser, run_prepare_model

    return run_prepare_model(_parser(add_prepare_model_parser).parse_args(argv))


@subcommand("replay", "play a recorded session tape in the playground (no vLLM needed)")
def _replay(argv: list[str]) -> int:
    from cli.replay import add_replay_parser, run_replay

    return run_replay(_parser(add_replay_parser).parse_args(argv))


@subcommand("doctor", "what this box gives kvscope (vLLM, GPU, memory, scheduling), what to do")
def _doctor(argv: list[str]) -> int:
    from cli.doctor import add_doctor_parser, run_doctor

    args, engine_argv = _parser(add_doctor_parser).parse_known_args(argv)
    refuse_unknown_flags(args, engine_argv)
    return run_doctor(args, engine_argv)


@subcommand("engine-help", "list every vLLM engine flag")
def _engine_help(_argv: list[str]) -> int:
    from engine.vllm.options import vllm_parser

    # Every word after the name is ignored, --help included: vLLM's flags are the help.
    vllm_parser("kvscope [engine flags]").print_help()
    return 0


# -- the playground -------------------------------------------------------------------------


def _playground(rest: list[str]) -> int:
    args, engine_argv = app_parser().parse_known_args(rest)
    refuse_attach_flags(args)
    refuse_unknown_flags(args, engine_argv)
    from cli.launch import quiet_native_warnings

    quiet_native_warnings()
    from cli.engine_choice import playground_engine
    from cli.session_tape import resumed_tape
    from tui.app import run_tui

    resumed = resumed_tape(args)  # before this session's own tape, which would be newest
    script = None
    if args.screenshot:
        from cli.demo import run_demo

        script = run_demo
    # A scripted demo's picture is not a session worth keeping: taped only when asked.
    by_default = not (args.fake or args.screenshot)
    opened = playground_engine(args, engine_argv, resumed, record_by_default=by_default)
    with opened as (engine, tapes):
        if not args.screenshot:
            from cli.terminal import NoTerminal, require_terminal

            try:
                require_terminal("The playground")
            except NoTerminal:
                tapes.discard()  # a session that never began: no tape of it
                raise
        return run_tui(engine, script=tapes.script(script), screenshot=args.screenshot)


if __name__ == "__main__":
    sys.exit(main())
