"""What the app does with session tapes: say where this session's tape goes, show the
recorder's notices as toasts, and put a resumed session's transcript back (`--resume`).

A resumed transcript is rebuilt from the tape's records, not from text: every reply gets
the footer it had (TTFT, ITL, tokens/s, how it ended), and a reply the tape leaves open (a
crash or a kill mid-reply) shows what had arrived, marked interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from engine.events import ChatMessage, RequestAccepted, TokenEvent
from engine.tape import RecordedRequest, RecordingCutOff, Tape, TapeRecorder, Turn
from tui.screens.main import MainScreen, send_labels
from tui.widgets.chat_pane import ChatPane

if TYPE_CHECKING:
    from tui.app import KvscopeApp
    from tui.widgets.reply_block import ReplyBlock

NOTICE_TIMEOUT_S = 12.0
EARLIER_NOTE = "⟨from an earlier session⟩"


def announce_tape(app: KvscopeApp, recorder: TapeRecorder | None, problem: str | None) -> None:
    """One toast saying where this session is recorded (or why it is not); from now on
    the recorder's notices (size cap, a failed write) come as toasts too."""
    if recorder is not None:
        app.notify(
            f"Recording this session to {recorder.path} (--no-tape turns it off).",
            title="Tape",
            timeout=NOTICE_TIMEOUT_S,
        )

        def on_notice(text: str) -> None:
            # Called on the tape's writer thread: app.notify only posts a message, which
            # is thread-safe. Once the app is gone there is nobody left to tell.
            with contextlib.suppress(RuntimeError):
                app.notify(text, title="Tape", severity="warning", timeout=NOTICE_TIMEOUT_S)

        recorder.on_notice = on_notice
        if recorder.notice is not None:  # stopped before the app was there to say it
            on_notice(recorder.notice)
    if problem:
        app.notify(problem, title="Tape", severity="warning", timeout=NOTICE_TIMEOUT_S)


def request_number(request_id: str) -> int:
    """The turn number in a request ID the playground made ("r12" and "r12.3" → 12)."""
    found = re.match(r"r(\d+)", request_id)
    return int(found.group(1)) if found else 0


async def restore_transcript(main: MainScreen, tape: Tape) -> int:
    """Put the tape's last chat back on `main`: the transcript with its footers, and the
    history the model is sent with the next turn. Returns the turns restored."""
    # Run from the app's start-up script: the screen may not be composed yet, and that
    # has no event to await.
    while not main.is_mounted or not main.query(ChatPane):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    chat = main.chat
    turns = tape.last_chat()
    history = tape.chat_history()
    for message in earlier_messages(turns, history):
        if message.role == "user":
            await chat.add_user_message(message.content, EARLIER_NOTE)
        else:
            await chat.add_notice(message.content)
    for turn in turns:
        await restore_turn(chat, turn)
    main.conversation.messages = list(history)
    numbers = [request_number(r.request_id) for t in turns for r in t.requests]
    main.conversation.turns = max([*numbers, len(turns)])
    if turns or history:
        await chat.add_notice(
            f"Resumed from {Path(tape.path).name}: {len(turns):,} turn(s) restored; the next "
            f"message goes on from the {len(history):,} message(s) of this chat."
        )
    return len(turns)


def earlier_messages(
    turns: tuple[Turn, ...], history: tuple[ChatMessage, ...]
) -> tuple[ChatMessage, ...]:
    """History older than this tape's turns: a session that was itself resumed sent it
    with its first chat turn, but never showed it as turns of its own."""
    first = next((r for t in turns for r in t.requests if r.request.messages), None)
    if first is None:
        return ()
    return first.request.messages[:-1]


async def restore_turn(chat: ChatPane, turn: Turn) -> None:
    message = turn.message
    requests = turn.requests
    if message is None and not requests:
        return
    ids = [r.request_id for r in requests]
    text = message.text if message is not None else ""
    if not ids:
        await chat.add_user_message(text)  # sent, but nothing reached the engine
        return
    note, title = send_labels(ids, message.synthetic_tokens if message is not None else None)
    await chat.add_user_message(text, note)
    reply = await chat.add_reply(title, ids)
    for copy, recorded in enumerate(requests):
        await restore_reply(reply, copy, recorded)
    await reply.tick()


async def restore_reply(reply: ReplyBlock, copy: int, recorded: RecordedRequest) -> None:
    """Feed one recorded request into its reply, as the live stream did, then end it as
    the tape says it ended."""
    for event in recorded.events:
        if isinstance(event, TokenEvent):
            await reply.add_token(copy, event)
        elif isinstance(event, RequestAccepted):
            reply.accepted(copy)
    status = recorded.status
    tokens = sum(len(t.token_ids) for t in recorded.tokens)
    finished = recorded.finished
    if finished is not None:
        await reply.finish(copy, finished)
    elif recorded.failure is not None:
        await reply.fail(copy, recorded.failure.error.plain())
    elif status == "abandoned":
        await reply.fail(copy, f"left unfinished when the session ended, after {tokens:,} tokens")
    else:
        await reply.fail(copy, RecordingCutOff(recorded.request_id, tokens).plain())
