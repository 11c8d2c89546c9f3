"""The engine a command asked for: chosen from its flags, opened, and taped when asked.

Every command that runs an engine opens it here. The playground offers every kind
(`--fake`, then `--url`, else vLLM in this process) and its app starts the engine behind
a loading screen; `bench` starts any of them headless, with progress on stderr, and
`generate` any but `--fake`; `bench --compare` starts vLLM once per config.

A new engine is one folder under engine/ and one EngineKind in KINDS; flags of its own
go beside those of the kinds it is chosen among (`--url`'s are in cli/attach.py).
`kvscope replay` chooses no engine: its tape, the command's argument, is the engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cli.attach import attached_engine, check_replicas, make_remote, with_fleet
from cli.launch import STOP, route_logs, running_engine, stop_engine
from cli.session_tape import open_recorder, recorded, session_tape

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

    from cli.session_tape import SessionTape
    from engine.protocol import Engine
    from engine.tape import Tape

    Check = Callable[[argparse.Namespace], None]
    """Sees vLLM's parsed flags before the model loads, to refuse inputs they rule out."""
    Starter = Callable[
        [argparse.Namespace, list[str], Check | None], AbstractContextManager[Engine]
    ]


@dataclass(frozen=True)
class EngineKind:
    """One engine kvscope can open: the flags that choose it, and how it is opened."""

    name: str
    asked: Callable[[argparse.Namespace], bool]
    """Whether the flags ask for it; KINDS are asked in order, the first that says yes wins."""
    for_playground: Callable[[argparse.Namespace, list[str]], Engine]
    """Made, not started: the app starts it behind its loading screen."""
    started: Starter | None = None
    """Started with progress on stderr, and always stopped after the block (None: only
    the playground offers it)."""
    refuse: Callable[[argparse.Namespace, list[str]], None] | None = None
    """Raises BadOption for flags that a headless start of it cannot take, before any
    tape or engine is opened (None: it takes them all)."""
    outlives_app: bool = True
    """Whether stopping it is work left once the app is gone, said as it is done."""


def _fake(_args: argparse.Namespace, _engine_argv: list[str]) -> Engine:
    from engine.clock import RealClock
    from engine.fake import FakeConfig, FakeEngine

    # Prefix caching on, as vLLM has it by default: a second chat turn lands on the blocks
    # the first one left, and the block map shows them cached and reused.
    return FakeEngine(FakeConfig(prefix_caching=True), clock=RealClock())


def _in_process(args: argparse.Namespace, engine_argv: list[str]) -> Engine:
    # Before vLLM is imported, and while the terminal is still a terminal: a log that
    # cannot go to the cache is said here, not drawn over the app.
    route_logs()
    from engine.vllm.engine import VllmEngine

    emulation = None
    if args.emulate_gpu:
        from engine.nvml import gpu_devices
        from roofline.emulation import plan_emulation

        # On a GPU the emulated pool lives in the GPU's memory, not the host's, and takes
        # CUDA's block size: size it from the device that will hold it.
        devices = gpu_devices()
        plan = plan_emulation(
            args.emulate_gpu,
            args.emulate_model,
            engine_argv,
            scale=args.emulate_scale,
            on_gpu=bool(devices),
            memory_bytes=devices[0].total_bytes if devices else None,
        )
        engine_argv, emulation = plan.engine_argv, plan.info
    return VllmEngine(argv=engine_argv, emulation=emulation)


def _refuse_for_fake(args: argparse.Namespace, engine_argv: list[str]) -> None:
    from engine.errors import BadOption

    # Headless, a flag the fake would ignore would make a run measure what was not asked.
    if engine_argv:
        raise BadOption(engine_argv[0], "vLLM engine flags do not apply to the --fake engine")
    if args.url:
        raise BadOption("--fake", "give --fake or --url, not both")


@contextlib.contextmanager
def _started_fake(
    _args: argparse.Namespace, _engine_argv: list[str], _check: Check | None
) -> Iterator[Engine]:
    from engine.clock import RealClock
    from engine.fake import FakeEngine

    # The fake's defaults (prefix caching off, unlike the playground's): what `bench
    # --fake` has always measured, so its numbers compare with earlier runs.
    fake = FakeEngine(clock=RealClock())
    fake.start()
    try:
        yield fake
    finally:
        fake.shutdown()


KINDS: tuple[EngineKind, ...] = (
    # Nothing to stop but the app, which Ctrl-C ends at once. `generate` has no --fake:
    # its flags never ask for it.
    EngineKind(
        "fake",
        lambda a: bool(getattr(a, "fake", False)),
        _fake,
        _started_fake,
        outlives_app=False,
        refuse=_refuse_for_fake,
    ),
    # A client of a running server: no vLLM, torch or GPU needed here.
    EngineKind(
        "server",
        lambda a: bool(a.url),
        lambda a, v: with_fleet(a, make_remote(a, v)),
        lambda a, v, _: attached_engine(a, v),
    ),
    EngineKind("vllm", lambda _: True, _in_process, lambda _, v, c: running_engine(v, check=c)),
)


@contextlib.contextmanager
def playground_engine(
    args: argparse.Namespace,
    engine_argv: list[str],
    resumed: Tape | None,
    *,
    record_by_default: bool,
) -> Iterator[tuple[Engine, SessionTape]]:
    """The playground's engine, not started, taped as `session_tape` decides, and the tape.

    The tape is opened once the engine is made, so that a session refused on its flags
    leaves no file; after the block the engine is stopped, then the tape closed.
    """
    check_replicas(args)
    kind = next(k for k in KINDS if k.asked(args))
    engine = kind.for_playground(args, engine_argv)
    tapes = session_tape(args, resumed, record_by_default=record_by_default)
    STOP.quiet = True  # a SIGINT or SIGTERM ends the app first, then is said
    try:
        yield tapes.wrap(engine), tapes
    finally:
        if kind.outlives_app:
            STOP.quiet = False
            STOP.announce()
            # The app may be gone while the engine is still loading or mid-prefill: the
            # step thread is joined before the interpreter may exit.
            stop_engine(engine)
        tapes.close()  # after the engine: its last steps are on the tape


@contextlib.contextmanager
def started_engine(
    args: argparse.Namespace,
    engine_argv: list[str],
    *,
    check: Check | None = None,
    tape: str | None = None,
) -> Iterator[Engine]:
    """A headless command's engine, started with progress on stderr, taped to `tape` when
    one is given, and always stopped after the block (the tape closed before it)."""
    given, _ = _headless(args)
    if given.refuse is not None:
        # On the flags as given, before `--replica` may stand in for `--url`.
        given.refuse(args, engine_argv)
    check_replicas(args)
    recorder = open_recorder(tape) if tape else None  # said before any engine
    _, start = _headless(args)  # chosen again: `--replica` alone now asks for the server
    with start(args, engine_argv, check) as inner, recorded(inner, recorder) as engine:
        yield engine


def _headless(args: argparse.Namespace) -> tuple[EngineKind, Starter]:
    """The first of KINDS that starts headless and that the flags ask for, and its start."""
    return next((k, k.started) for k in KINDS if k.started is not None and k.asked(args))
