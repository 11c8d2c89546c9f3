"""ChatPane: the transcript and the message box."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Input, Static

from engine.events import EngineState
from tui.widgets.engine_status import EngineStatus
from tui.widgets.reply_block import ReplyBlock, StatusSource

if TYPE_CHECKING:
    from textual.app import ComposeResult

EMPTY_HINT = (
    "Type a message and press Enter. The reply streams in token by token; its footer "
    "shows TTFT, ITL and tokens/s. ctrl+l colours each token by its latency."
)


class ChatPane(Vertical):
    """Transcript (append-only, anchored to the bottom) above a one-line message box."""

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Bound from the screen; the status banner shows it."""
    busy: reactive[bool] = reactive(False)
    """A reply is streaming."""
    latency_colours: reactive[bool] = reactive(False)
    """Show each reply's tokens coloured by their latency instead of as Markdown."""
    synthetic_tokens: reactive[int | None] = reactive(None)
    """When set, Enter sends a synthetic prompt of this many tokens (bound from the
    controls), with whatever is typed appended; an empty Enter sends it too."""

    @dataclass
    class Submitted(Message):
        """The user sent a message."""

        text: str

    def compose(self) -> ComposeResult:
        yield EngineStatus().data_bind(ChatPane.engine_state)
        with VerticalScroll(id="transcript"):
            yield Static(EMPTY_HINT, id="chat-empty")
        yield Input(placeholder="Message", id="chat-input")

    def on_mount(self) -> None:
        self.query_one("#transcript", VerticalScroll).anchor()
        self._sync_placeholder()

    @property
    def input(self) -> Input:
        return self.query_one("#chat-input", Input)

    @property
    def status(self) -> EngineStatus:
        return self.query_one(EngineStatus)

    @on(Input.Submitted, "#chat-input")
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text and self.synthetic_tokens is None:
            return
        self.post_message(self.Submitted(text))

    def watch_synthetic_tokens(self) -> None:
        self._sync_placeholder()

    def watch_busy(self) -> None:
        self._sync_placeholder()

    def _sync_placeholder(self) -> None:
        if not self.is_mounted:
            return
        if self.busy:
            hint = "A reply is streaming: Esc stops it"
        elif self.synthetic_tokens is not None:
            hint = (
                f"Enter sends a {self.synthetic_tokens:,}-token synthetic prompt "
                "(type to append a message)"
            )
        else:
            hint = "Message"
        self.input.placeholder = hint

    def watch_latency_colours(self, on: bool) -> None:
        self.set_class(on, "-latency")
        for reply in self.query(ReplyBlock):
            reply.set_latency_mode(on)

    # -- transcript ------------------------------------------------------------------------
    @property
    def transcript(self) -> VerticalScroll:
        return self.query_one("#transcript", VerticalScroll)

    async def add_user_message(self, text: str, note: str | None = None) -> None:
        await self._drop_hint()
        body = Text()
        if note:
            body.append(note, "italic")
            if text:
                body.append("\n")
        body.append(text)
        await self.transcript.mount(Static(body, classes="user-message"))

    async def add_reply(
        self, title: str, request_ids: list[str], status: StatusSource | None = None
    ) -> ReplyBlock:
        await self._drop_hint()
        reply = ReplyBlock(title, request_ids, status=status)
        await self.transcript.mount(reply)
        reply.set_latency_mode(self.latency_colours)
        self.transcript.anchor()
        return reply

    async def add_notice(self, text: str, *, error: bool = False) -> None:
        """A line from kvscope itself, e.g. why a message could not be sent."""
        await self._drop_hint()
        notice = Static(Text(text), classes="notice -error" if error else "notice")
        await self.transcript.mount(notice)

    async def clear(self) -> None:
        await self.transcript.remove_children()
        await self.transcript.mount(Static(EMPTY_HINT, id="chat-empty"))

    async def _drop_hint(self) -> None:
        for hint in self.query("#chat-empty"):
            await hint.remove()

    def replies(self) -> list[ReplyBlock]:
        return list(self.query(ReplyBlock))

    def transcript_text(self) -> str:
        """Everything the transcript shows, as plain text (for tests and the demo)."""
        lines: list[str] = []
        for child in self.transcript.children:
            if isinstance(child, ReplyBlock):
                lines.append(child.title)
                lines.append(child.text)
                lines.extend(child.copies_text)
                lines.append(child.footer_text)
            elif isinstance(child, Static):
                lines.append(str(child.render()))
        return "\n".join(lines)
