"""ChatPane: the transcript and the message box."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Input, Static

from engine.events import EngineState
from tui.widgets.engine_status import EngineStatus
from tui.widgets.reply_block import ReplyBlock, StatusSource

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.geometry import Size

LIVE_REPLIES = 2
"""The newest replies stay whole widgets; older ones are folded into static text."""

EMPTY_HINT = (
    "Type a message and press Enter. The reply streams in token by token; its footer "
    "shows TTFT, ITL and tokens/s. ctrl+l colours each token by its latency."
)


LATENCY_KEY = (
    "ctrl+l colours: [$accent underline]first token[/] (TTFT) · "
    "[$success]≤ 1.5× median ITL[/] · [$warning]≤ 3×[/] · [$error reverse]slower[/]"
)
"""The key to the latency colours, shown under the transcript while they are on."""


class Transcript(VerticalScroll):
    """The scrolling list of messages and replies."""

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        # Textual lays the screen out again in the next frame whenever the virtual size
        # changed (tui/widgets/single_layout.py); here only the first overflow needs it,
        # to show the scrollbar. After that a reply's growth is one layout, not two.
        overflowed = self.virtual_size.height > self.container_size.height
        overflows = virtual_size.height > container_size.height
        return super()._size_updated(
            size, virtual_size, container_size, layout=layout and overflowed != overflows
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
    stoppable = True
    """Esc stops a streaming reply here, and its footer says so; a replay's cannot."""

    @dataclass
    class Submitted(Message):
        """The user sent a message."""

        text: str

    def compose(self) -> ComposeResult:
        yield EngineStatus().data_bind(ChatPane.engine_state)
        with Transcript(id="transcript"):
            yield Static(EMPTY_HINT, id="chat-empty")
        key = Static(LATENCY_KEY, id="latency-key")
        key.display = False
        yield key
        yield Input(placeholder="Message", id="chat-input")

    def on_mount(self) -> None:
        self.query_one("#transcript", VerticalScroll).anchor()
        self._sync_placeholder()
        self.app.theme_changed_signal.subscribe(self, self._recolour_folded)

    def _recolour_folded(self, theme: object) -> None:
        # Folded replies carry colours, not CSS: draw them again in the new theme's.
        for reply in self.replies():
            if reply.folded:
                reply.set_latency_mode(self.latency_colours)

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
            # Short enough for the 55-cell chat column at 160x48.
            hint = f"Enter: {self.synthetic_tokens:,} synthetic tokens (+ what you type)"
        else:
            hint = "Message"
        self.input.placeholder = hint

    def watch_latency_colours(self, on: bool) -> None:
        self.set_class(on, "-latency")
        if self.is_mounted:
            self.query_one("#latency-key").display = on
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
        self,
        title: str,
        request_ids: list[str],
        status: StatusSource | None = None,
        *,
        synthetic: bool = False,
    ) -> ReplyBlock:
        await self._drop_hint()
        reply = ReplyBlock(
            title, request_ids, status=status, synthetic=synthetic, stoppable=self.stoppable
        )
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

    async def fold_older(self, keep: int = LIVE_REPLIES) -> None:
        """Fold every finished reply but the newest `keep` into static text (see
        ReplyBlock.fold): a long session then costs a widget per reply, not a dozen."""
        replies = self.replies()
        old = replies[: max(0, len(replies) - keep)]
        children = list(self.transcript.children)
        for reply in old:
            if reply.done and not reply.folded:
                # The message it answered goes into the same Static, one widget less.
                before = children.index(reply) - 1
                message = children[before] if before >= 0 else None
                if isinstance(message, Static) and message.has_class("user-message"):
                    content = message.content
                    await reply.fold(user=content if isinstance(content, Text) else None)
                    if reply.folded and isinstance(content, Text):
                        await message.remove()
                else:
                    await reply.fold()
        if old:
            self._drop_hidden_caches(until=old[-1])

    def _drop_hidden_caches(self, until: ReplyBlock) -> None:
        """Let the older entries out of view forget their drawn lines: each widget keeps
        every line it drew (Strips, each with seven small caches), about half a MiB a
        reply. Scrolled back into view, they draw again."""
        transcript = self.transcript
        view = Region(0, round(transcript.scroll_y), *transcript.scrollable_content_region.size)
        for child in transcript.children:
            if not child.virtual_region.overlaps(view):
                for widget in child.walk_children(with_self=True):
                    widget.refresh()
            if child is until:
                break

    def replies(self) -> list[ReplyBlock]:
        return list(self.query(ReplyBlock))

    def transcript_text(self) -> str:
        """Everything the transcript shows, as plain text (for tests and the demo)."""
        lines: list[str] = []
        for child in self.transcript.children:
            if isinstance(child, ReplyBlock):
                if child.folded_user is not None:
                    lines.append(child.folded_user)
                lines.append(child.title)
                lines.append(child.text)
                lines.extend(child.copies_text)
                lines.append(child.footer_text)
            elif isinstance(child, Static):
                lines.append(str(child.render()))
        return "\n".join(lines)
