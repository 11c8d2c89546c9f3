"""Session tapes on the command line.

- `kvscope replay TAPE`: the playground on a ReplayEngine; `--json` prints every request's
  timings (as `generate --json` does for one) and every step; `--svg OUT --at STEP` saves
  the screen at a step, headless. It needs no vLLM and no torch.
- The playground's `--tape PATH`, `--no-tape` and `--resume [TAPE]`, and the `--tape PATH`
  of `generate` and `bench`: opening this session's tape, and wrapping the engine in it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption, KvscopeError
from engine.events import RequestFinished
from engine.tape import (
    RecordedRequest,
    RecordingEngine,
    Tape,
    TapeError,
    TapeHasNoSession,
    TapeRecorder,
    TapeUnwritable,
    read_tape,
    tapes_dir,
)
from engine.tape.paths import SUFFIX

if TYPE_CHECKING:
    from engine.protocol import Engine
    from tui.app import KvscopeApp

Script = Callable[["KvscopeApp"], Awaitable[None]]
DEFAULT_SVG_SIZE = "160x48"
RESUME_LATEST = "latest"  # --resume with no TAPE
RESUME_LOOK_BACK = 20  # tapes tried, newest first, for one that holds a chat


# -- reading a tape -------------------------------------------------------------------------


def load_tape(path: str | Path) -> Tape:
    """Read a tape; a torn last line is said in one `kvscope: ...` line, and read past."""
    from cli.launch import say

    logger = logging.getLogger("kvscope")
    quiet = logging.NullHandler()
    # The reader logs the torn line too; with no handler, Python would print it bare.
    logger.addHandler(quiet)
    try:
        tape = read_tape(path)
    finally:
        logger.removeHandler(quiet)
    for warning in tape.warnings:
        say(warning.plain())
    return tape


def token_times(recorded: RecordedRequest) -> list[float]:
    """One time per output token; tokens sent again after a preemption take the later
    time, as the engines and the replay count them."""
    times: list[float] = []
    for event in recorded.tokens:
        times[event.index :] = [event.time_s] * len(event.token_ids)
    return times


def request_json(recorded: RecordedRequest) -> dict[str, Any]:
    """One request's timings with the keys of `generate --json`, and how it ended."""
    times = token_times(recorded)
    finished = recorded.finished
    summary = finished
    if summary is None:
        # Never finished (a failure, a kill): the same sums over the tokens that came.
        accepted = recorded.accepted
        summary = RequestFinished.from_times(
            recorded.request_id,
            "abort",
            prompt_tokens=recorded.prompt_tokens or 0,
            submitted_at=accepted.submitted_at if accepted else recorded.started_at,
            token_times=times,
            now=times[-1] if times else recorded.started_at,
        )
    message = recorded.message
    return {
        "request_id": recorded.request_id,
        "status": recorded.status,
        "message": message.text if message is not None else None,
        "synthetic_tokens": message.synthetic_tokens if message is not None else None,
        "started_at": recorded.started_at,
        "ttft_s": summary.ttft_s,
        "itl_s": list(summary.itl_s),
        "e2e_s": summary.e2e_s,
        "output_tokens": summary.output_tokens,
        "prompt_tokens": recorded.prompt_tokens,
        "finish_reason": finished.reason if finished is not None else None,
        "preemptions": finished.preemptions if finished is not None else 0,
        "token_times": times,
        "error": recorded.failure.error.plain() if recorded.failure is not None else None,
        "text": recorded.text,
    }


def tape_json(tape: Tape) -> dict[str, Any]:
    """Everything `replay --json` prints: the model card, every request, every step."""
    card = tape.card
    return {
        "tape": str(tape.path),
        "format_version": tape.version,
        "created": tape.created,
        "clock": tape.clock,
        "ended": tape.end.reason if tape.end is not None else None,
        "warnings": [w.plain() for w in tape.warnings],
        "model": dataclasses.asdict(card) if card is not None else None,
        "requests": [request_json(r) for r in tape.requests],
        "steps": [dataclasses.asdict(s) for s in tape.steps],
    }


# -- kvscope replay ---------------------------------------------------------------------------


def add_replay_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="play a recorded session tape in the playground (no vLLM needed)",
        usage="kvscope replay TAPE [--speed X] [--paused] | --json | --svg OUT [--at STEP]",
        description=(
            "Play a session tape in the playground, as it was recorded: the chat, the\n"
            "block map and every plot, with no engine and no model. Space pauses, left and\n"
            "right step, Home and End jump. Tapes are kept in "
            f"{tapes_dir()}\n(one per session; `kvscope --no-tape` records none)."
        ),
        epilog=(
            "examples:\n"
            "  kvscope replay docs/tapes/kv-pool-preemption.jsonl\n"
            "  kvscope replay session.jsonl --speed 4\n"
            "  kvscope replay session.jsonl --json > timings.json\n"
            "  kvscope replay session.jsonl --svg step300.svg --at 300"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Any number of words, so that none or two are said in kvscope's words, not argparse's.
    p.add_argument(
        "tape", metavar="TAPE", nargs="*", help="the tape: a .jsonl file a session recorded"
    )
    p.add_argument(
        "--speed", type=float, default=1.0, metavar="X", help="playing speed, 1 = as recorded (1)"
    )
    p.add_argument("--paused", action="store_true", help="open paused at the start")
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help="print the model card, every request's timings and every step as JSON",
    )
    out.add_argument("--svg", metavar="OUT.svg", help="save the screen as SVG, headless, and exit")
    p.add_argument(
        "--at",
        type=int,
        metavar="STEP",
        help="with --svg: the replay after this many of the tape's steps (default: the end)",
    )
    p.add_argument(
        "--size",
        default=DEFAULT_SVG_SIZE,
        metavar="WxH",
        help=f"with --svg: the screen's size in columns x rows ({DEFAULT_SVG_SIZE})",
    )
    return p


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    try:
        size = int(width), int(height)
    except ValueError:
        raise BadOption("--size", f"{text!r} is not WIDTHxHEIGHT, e.g. 160x48") from None
    if size[0] < 40 or size[1] < 12:
        raise BadOption("--size", f"{text} is too small; the screen needs at least 40x12")
    return size


def check_svg_path(path: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise BadOption("--svg", f"{target} is a folder, not a file")
    if not target.parent.is_dir():
        raise BadOption("--svg", f"the folder {target.parent} does not exist")


def run_replay(args: argparse.Namespace) -> int:
    if not math.isfinite(args.speed) or args.speed <= 0:
        raise BadOption("--speed", f"{args.speed} is not a speed: give a number above 0")
    if args.at is not None and not args.svg:
        raise BadOption("--at", "it picks the step for --svg; give --svg OUT.svg too")
    size = parse_size(args.size)
    if args.svg:
        check_svg_path(args.svg)
    tape = load_tape(one_tape(args.tape))
    if args.json:
        # Strict JSON (no NaN or Infinity, which JSON does not have): unknown is null.
        json.dump(finite(tape_json(tape)), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    if tape.card is None:
        raise TapeHasNoSession(tape.path)
    length = len(tape.steps)
    if args.svg:
        at = length if args.at is None else args.at
        if not 0 <= at <= length:
            raise BadOption("--at", f"{at:,} is not a step of this tape: it has 0 to {length:,}")
        return save_svg(tape, args.svg, at, size)
    return play(tape, speed=args.speed, paused=args.paused)


class NotOneTape(KvscopeError):
    """`kvscope replay` with no TAPE, or with more than one."""

    def __init__(self, given: list[str]) -> None:
        super().__init__(given)
        self.given = given

    def plain(self) -> str:
        if not self.given:
            return (
                "replay needs the tape to play: `kvscope replay TAPE` (the tapes of "
                f"past sessions are in {tapes_dir()})"
            )
        names = ", ".join(self.given)
        return f"replay plays one tape at a time, but was given {len(self.given):,}: {names}"


def one_tape(given: list[str]) -> str:
    if len(given) != 1:
        raise NotOneTape(given)
    return given[0]


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float made None, for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def play(tape: Tape, *, speed: float, paused: bool) -> int:
    from cli.terminal import require_terminal
    from engine.replay import ReplayEngine
    from tui.app import run_tui

    require_terminal("kvscope replay (without --json or --svg)")

    engine = ReplayEngine(tape, speed=speed, paused=paused)
    engine.start()
    return run_tui(engine, script=warn_in_app(tape))


def warn_in_app(tape: Tape) -> Script | None:
    """The tape's warnings (a torn last line) as toasts too: the line said on stderr is
    hidden while the app has the terminal."""
    if not tape.warnings:
        return None

    async def warn(app: KvscopeApp) -> None:
        for warning in tape.warnings:
            app.notify(warning.plain(), title="Tape", severity="warning", timeout=15)

    return warn


def save_svg(tape: Tape, out: str, at: int, size: tuple[int, int]) -> int:
    from engine.clock import VirtualClock
    from engine.replay import ReplayEngine
    from tui.app import run_tui

    engine = ReplayEngine(tape, clock=VirtualClock(), paused=True)
    engine.start()
    saved: list[str] = []

    async def script(app: KvscopeApp) -> None:
        # Whatever happens, the app must exit: headless, nobody could close it.
        try:
            await replay_to(app, at)
            app.save_screenshot(filename=out)
            saved.append(out)
        except OSError as exc:
            saved.append(f"error: could not write {out}: {exc.strerror or exc}")
        except Exception as exc:
            saved.append(f"error: the replay did not reach step {at:,}: {exc!r}")
        finally:
            app.exit(0)

    run_tui(engine, script=script, screenshot=out, size=size)
    from cli.launch import say

    if not saved or saved[0].startswith("error: "):
        say(saved[0].removeprefix("error: ") if saved else f"no screen was saved to {out}")
        return 1
    snap = engine.snapshot()
    where = f"step {snap.position:,} / {snap.length:,}"
    print(f"saved {out}: the replay at {where}, {size[0]}x{size[1]}")
    return 0


async def replay_to(app: KvscopeApp, at: int, timeout: float = 60.0) -> None:
    """Seek a paused replay in `app` to `at`, and wait until every panel shows it."""
    from tui.screens.replay import ReplayScreen
    from tui.widgets.engine_panel import HOST_CHECK_S

    main = app.main_screen
    assert isinstance(main, ReplayScreen)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # The bar gets its first position once the screen took the card and started playing.
    # A screen's state has no event to await: look at it, as the demo does.
    while main.bar.position is None and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    if at >= main.replay.length:
        main.action_seek_end()  # the records after the last step too
    else:
        main.replay.seek(at)
    # Sends become replies by message and streams are read by workers: wait until a few
    # looks in a row find nothing new.
    seen: object = None
    still = 0
    while still < 3 and loop.time() < deadline:
        await asyncio.sleep(0.03)
        await main.redraw()
        replies = main.chat.replies()
        received = [c.received for r in replies for c in r.copies]
        now = (len(replies), received, app.telemetry.steps_version, main.bar.words)
        still = still + 1 if now == seen else 0
        seen = now
    # The engine panel looks at the host's load once a second: once more, on these steps.
    await asyncio.sleep(HOST_CHECK_S)
    await main.redraw()
    await asyncio.sleep(0.2)  # let the compositor paint what the redraw changed


# -- this session's tape (the playground, generate, bench) -----------------------------------


def add_tape_args(parser: argparse.ArgumentParser) -> None:
    """The playground's flags: record by default, choose where, or resume."""
    group = parser.add_argument_group(
        "session tapes (every session is recorded; `kvscope replay TAPE` plays one)"
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--tape",
        metavar="PATH",
        help=f"record this session to PATH (default: a new file in {tapes_dir()})",
    )
    where.add_argument("--no-tape", action="store_true", help="do not record this session")
    group.add_argument(
        "--resume",
        nargs="?",
        const=RESUME_LATEST,
        metavar="TAPE",
        help="go on with the last chat of TAPE (default: the newest tape): its transcript, "
        "footers included, and its history, on a fresh engine",
    )


def add_record_arg(parser: argparse.ArgumentParser) -> None:
    """`generate` and `bench`: record only when asked."""
    parser.add_argument(
        "--tape",
        metavar="PATH",
        help="record the session (every step and token) to PATH, for `kvscope replay`",
    )


# The recording engine hands on its engine's features (RecordingEngine.features), with
# the tape added; the old name stays for the callers here.
SessionRecording = RecordingEngine


def open_recorder(path: str | None) -> TapeRecorder:
    """This session's tape, opened before any engine loads (a bad path is said at once).

    Raises:
        TapeUnwritable: in plain words.
    """
    from cli.launch import say

    return TapeRecorder(path, on_notice=say)


@contextlib.contextmanager
def recorded(engine: Engine, recorder: TapeRecorder | None) -> Iterator[Engine]:
    """`engine`, taped while the block runs (as is without a recorder); the tape is
    closed after it, the engine left to its owner."""
    if recorder is None:
        yield engine
        return
    wrapped = SessionRecording(engine, recorder)
    try:
        yield wrapped
    finally:
        wrapped.close_tape()


def newest_tapes() -> list[Path]:
    folder = tapes_dir()
    if not folder.is_dir():
        return []
    tapes = [p for p in folder.glob(f"*{SUFFIX}") if p.is_file()]
    return sorted(tapes, key=lambda p: p.stat().st_mtime, reverse=True)


class NothingToResume(KvscopeError):
    def __init__(self, folder: Path, looked: int, unread: list[TapeError] | None = None) -> None:
        super().__init__(str(folder), looked)
        self.folder = folder
        self.looked = looked
        self.unread = unread or []  # the tapes among them that could not be read

    def plain(self) -> str:
        if not self.looked:
            return (
                f"No tape to resume: {self.folder} holds none (every session is recorded "
                "there unless --no-tape is given). Name one: --resume TAPE."
            )
        damaged = ""
        if self.unread:
            first = self.unread[0].plain().rstrip(".")
            damaged = f" ({len(self.unread):,} could not be read; the newest: {first})"
        return (
            f"No tape to resume: none of the newest {self.looked:,} tapes in {self.folder} "
            f"holds a chat{damaged}. Name one: --resume TAPE."
        )


def resume_tape(which: str) -> Tape:
    """The tape `--resume` goes on from: the one named, or the newest that holds a chat.

    Called before this session's own tape is created, which would otherwise be the newest.
    A session that sent nothing (say, one that only looked at a resumed transcript) is
    passed over, so resuming twice still finds the conversation.
    """
    if which != RESUME_LATEST:
        tape = load_tape(which)
        if tape.card is None and not tape.requests:
            raise TapeHasNoSession(tape.path)
        return tape
    candidates = newest_tapes()[:RESUME_LOOK_BACK]
    unread: list[TapeError] = []
    for path in candidates:
        try:
            tape = load_tape(path)
        except TapeError as exc:
            unread.append(exc)  # empty or damaged (a crash at start-up): an older may do
            continue
        if tape.last_chat() or tape.chat_history():
            return tape
    raise NothingToResume(tapes_dir(), len(candidates), unread)


@dataclass
class SessionTape:
    """The playground's tape: where this session is recorded, and what it resumes."""

    recorder: TapeRecorder | None
    resumed: Tape | None
    problem: str | None = None  # why the default tape could not be opened

    def wrap(self, engine: Engine) -> Engine:
        return engine if self.recorder is None else SessionRecording(engine, self.recorder)

    def script(self, then: Script | None) -> Script | None:
        """The app's start-up: say where the tape goes, restore the resumed chat, then
        `then` (the scripted demo)."""
        if self.recorder is None and self.resumed is None and not self.problem and then is None:
            return None

        async def start(app: KvscopeApp) -> None:
            from tui.session_tape import announce_tape, restore_transcript

            announce_tape(app, self.recorder, self.problem)
            if self.resumed is not None:
                warn = warn_in_app(self.resumed)  # a killed session's torn last line
                if warn is not None:
                    await warn(app)
                await restore_transcript(app.main_screen, self.resumed)
            if then is not None:
                await then(app)

        return start

    def discard(self) -> None:
        """Close the tape and remove it: the session it was opened for never began."""
        if self.recorder is not None:
            self.recorder.close()
            with contextlib.suppress(OSError):
                self.recorder.path.unlink()
            self.recorder = None

    def close(self) -> None:
        """Close the tape (idempotent); a notice from its last write goes to stderr."""
        if self.recorder is not None:
            from cli.launch import say

            self.recorder.on_notice = say
            self.recorder.close()


def session_tape(
    args: argparse.Namespace, resumed: Tape | None, *, record_by_default: bool
) -> SessionTape:
    """Open this session's tape: right before the app runs, so that a session refused at
    start-up leaves no file. A tape the user named must open; the default one may fail,
    with a notice in the app, and the session goes on unrecorded."""
    if args.no_tape or (args.tape is None and not record_by_default):
        return SessionTape(None, resumed)
    if args.tape is not None:
        return SessionTape(open_recorder(args.tape), resumed)
    try:
        return SessionTape(open_recorder(None), resumed)
    except TapeUnwritable as exc:
        return SessionTape(None, resumed, f"Not recording this session. {exc.plain()}")


def resumed_tape(args: argparse.Namespace) -> Tape | None:
    """The tape `--resume` names, read before this session's own tape exists (it would
    be the newest)."""
    return resume_tape(args.resume) if args.resume is not None else None
