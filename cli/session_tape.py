"""This session's tape, for every command that runs an engine: the playground's `--tape
PATH`, `--no-tape` and `--resume [TAPE]`, and the `--tape PATH` of `generate` and `bench`;
opening the tape, and wrapping the engine in it.

Playing a tape back is `kvscope replay` (`cli.replay`), whose reader `--resume` uses too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cli.replay import load_tape, warn_in_app
from engine.errors import KvscopeError
from engine.tape import (
    RecordingEngine,
    Tape,
    TapeError,
    TapeHasNoSession,
    TapeRecorder,
    TapeUnwritable,
    tapes_dir,
)
from engine.tape.paths import SUFFIX

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator
    from pathlib import Path

    from cli.replay import Script
    from engine.protocol import Engine
    from tui.app import KvscopeApp

RESUME_LATEST = "latest"  # --resume with no TAPE
RESUME_LOOK_BACK = 20  # tapes tried, newest first, for one that holds a chat


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
