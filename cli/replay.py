"""`kvscope replay TAPE`: the playground on a ReplayEngine; `--json` prints every request's
timings (as `generate --json` does for one) and every step; `--svg OUT --at STEP` saves the
screen at a step, headless. It needs no vLLM and no torch.

Recording a session, and `--resume` reading one back, are `cli.session_tape`'s; it reads
tapes with `load_tape` here.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption, KvscopeError
from engine.events import RequestFinished
from engine.tape import RecordedRequest, Tape, TapeHasNoSession, read_tape, tapes_dir

if TYPE_CHECKING:
    from tui.app import KvscopeApp

Script = Callable[["KvscopeApp"], Awaitable[None]]
DEFAULT_SVG_SIZE = "160x48"


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
        usage="kvscope replay TAPE [--speed X] [--paused] | --json | --svg OUT [--at RECORD]",
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
        metavar="RECORD",
        help=(
            "with --svg: the replay after this many of the tape's step records, the bar's "
            '"record N / M" (0 is the start), not the engine\'s step number that the '
            'bar and the status line show as "engine step" (default: the end)'
        ),
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
            raise BadOption(
                "--at", f"{at:,} is not a step record of this tape: it has 0 to {length:,}"
            )
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

    existed = Path(out).exists()
    code = run_tui(engine, script=script, screenshot=out, size=size)
    from cli.launch import say

    if not saved or saved[0].startswith("error: "):
        say(saved[0].removeprefix("error: ") if saved else f"no screen was saved to {out}")
        return 1
    if code != 0:
        # The app stopped on an error after the screen was written (Textual printed it
        # above): the file may not show what was asked for, so it is not called saved.
        if not existed:
            Path(out).unlink(missing_ok=True)
        say(f"no screen was saved to {out}: the app stopped on an error (above)")
        return code
    snap = engine.snapshot()
    where = f"record {snap.position:,} / {snap.length:,}"
    if snap.position:
        where += f" (engine step {snap.step:,})"
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
        # A send the screen has not taken in yet (its reply still being mounted) is not
        # seen in the replies: none may be pending, however still the rest looks.
        still = still + 1 if now == seen and main.sends_pending == 0 else 0
        seen = now
    # The engine panel looks at the host's load once a second: once more, on these steps.
    await asyncio.sleep(HOST_CHECK_S)
    await main.redraw()
    await asyncio.sleep(0.2)  # let the compositor paint what the redraw changed
