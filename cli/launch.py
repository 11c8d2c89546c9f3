"""Start a VllmEngine from command-line flags, with a progress bar on stderr, and stop it
cleanly on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator, Sequence
    from types import FrameType

    from engine.events import EmulationInfo, LoadProgress


def say(message: str) -> None:
    """One `kvscope: ...` line on stderr, safe inside a signal handler.

    A handler runs between two bytecodes of the main thread, maybe in the middle of a
    print to stderr; a second buffered write there raises "reentrant call", so this
    goes straight to the file descriptor.
    """
    lead = "\n" if os.isatty(2) else ""  # off the ^C the terminal echoed, or a progress bar
    os.write(2, f"{lead}kvscope: {message}\n".encode())


class GracefulStop:
    """Ctrl-C (SIGINT) and SIGTERM for kvscope's commands.

    The first signal says what is happening and unwinds the main thread with
    KeyboardInterrupt, so the `finally` blocks stop the engine and join its thread: an
    interpreter that exits while the engine thread is still inside torch's native code
    aborts with "terminate called without an active exception" (exit 134). A first signal
    that comes while kvscope is already stopping only says so. The second signal leaves
    at once through `os._exit`, which runs no destructors and so cannot abort.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.what = "the engine"
        # While a full-screen app owns the terminal, a line on stderr would be drawn over
        # it and vanish with it: the app's host says it with `announce()` once it is gone.
        self.quiet = False
        self._stopping = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread (a test may call main())
        self.signum = None
        self.quiet = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
        return 128 + (self.signum or signal.SIGINT)

    @contextmanager
    def stopping(self) -> Iterator[None]:
        """Code that must run to its end (joining the engine thread): a first signal
        inside it is noted, not raised."""
        self._stopping += 1
        try:
            yield
        finally:
            self._stopping -= 1

    def announce(self) -> None:
        """Say that kvscope is stopping, and how to force it."""
        if self.signum == signal.SIGINT:
            say(f"stopping {self.what}… (Ctrl-C again to force)")
        elif self.signum is not None:
            say(f"terminated; stopping {self.what}… (send it again to force)")

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            if not self.quiet:
                say("forced exit")
            os._exit(128 + signum)
        self.signum = signum
        if not self.quiet:
            self.announce()
        if not self._stopping:
            raise KeyboardInterrupt


# One per process: signal handlers are process-wide. `cli.main` installs it.
STOP = GracefulStop()


def quiet_native_warnings() -> None:
    # torch's C++ warnings go straight to file descriptor 2; keep them to errors.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("TQDM_DISABLE", "1")


def route_logs() -> None:
    """Send vLLM's log, and the Python warnings torch and vLLM raise on import, to the
    engine log instead of stderr. Call before vLLM is imported. Says so in one line when
    the cache folder cannot take the log."""
    from engine.paths import engine_log_path
    from engine.vllm.startup import route_vllm_logs

    route = route_vllm_logs(engine_log_path())
    notice = route.notice()
    if notice:
        say(notice)
    logging.captureWarnings(True)
    warnings_log = logging.getLogger("py.warnings")
    for handler in logging.getLogger("vllm").handlers:
        if handler not in warnings_log.handlers:
            warnings_log.addHandler(handler)
    warnings_log.propagate = False


@contextmanager
def progress_bar(title: str) -> Iterator[Progress]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[stage]}"),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
        disable=not console.is_terminal,
    ) as progress:
        yield progress


def stop_engine(engine: Any) -> None:
    """Shut the engine down and join its thread, whatever signal comes meanwhile."""
    # RuntimeError: interrupted between creating the step thread and starting it.
    with STOP.stopping(), contextlib.suppress(RuntimeError):
        engine.shutdown()


def str_flag(argv: Sequence[str], flag: str) -> str | None:
    """The value of an engine flag as written, read without vLLM (the last one wins).

    A fast path only, so that refusing a prompt past --max-model-len or a model folder
    that is not there takes no vLLM import (seconds); any other spelling (an
    abbreviation) is checked again once vLLM has parsed the flags.
    """
    names = {flag, "--" + flag[2:].replace("-", "_")}
    value = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def int_flag(argv: Sequence[str], flag: str) -> int | None:
    """An engine flag written as a plain whole number ("1k", vLLM's spelling, is not)."""
    value = str_flag(argv, flag)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@contextmanager
def running_engine(
    engine_argv: Sequence[str],
    *,
    check: Callable[[argparse.Namespace], None] | None = None,
    emulation: EmulationInfo | None = None,
) -> Iterator[Any]:  # the VllmEngine (typed loosely so importing this module stays cheap)
    """Prepare the model if needed, start the engine with progress, and always stop it.

    `check(flags)` sees vLLM's parsed flags before the model or the engine is touched,
    to refuse inputs that cannot work with them. Ctrl-C at any point, loading included,
    ends here with the engine thread joined.
    """
    from argparse import Namespace

    from engine.vllm.options import (
        build_engine_settings,
        check_model_reference,
        refuse_in_process_data_parallel,
    )

    model = str_flag(engine_argv, "--model")
    if model is not None:
        check_model_reference(model)  # a folder that is not there, said before vLLM loads
    # Data-parallel ranks cannot run in this process, whatever the other flags say: said
    # before vLLM's import (seconds). Other spellings (-dp) are refused once it has parsed.
    dp = int_flag(engine_argv, "--data-parallel-size")
    if dp is not None:
        refuse_in_process_data_parallel(Namespace(data_parallel_size=dp))
    quiet_native_warnings()
    route_logs()
    from engine.vllm.engine import VllmEngine

    engine = None
    try:
        with progress_bar("kvscope") as progress:
            task = progress.add_task("preparing model", total=1.0, stage="")

            def on_model(stage: str, fraction: float) -> None:
                progress.update(task, completed=fraction * 0.3, stage=stage)

            settings = build_engine_settings(engine_argv, on_model, check=check)
            progress.update(task, description="starting engine")

            def on_engine(p: LoadProgress) -> None:
                progress.update(task, completed=0.3 + 0.7 * p.fraction, stage=p.stage)

            engine = VllmEngine(
                settings.engine_args, model_label=settings.model_label, emulation=emulation
            )
            engine.start(on_engine)
        if not sys.stderr.isatty():
            card = engine.card
            assert card is not None
            print(
                f"kvscope: engine ready: {card.name} on {card.device}, max_model_len "
                f"{card.max_model_len}, KV pool {card.total_blocks} blocks x {card.block_size}",
                file=sys.stderr,
                flush=True,
            )
        yield engine
    finally:
        if engine is not None:
            stop_engine(engine)
