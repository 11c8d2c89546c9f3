"""ReplyBlock: one assistant reply, streamed in, then summed up in a footer of fields.

The footer's words are tui/widgets/reply_footer.py's, the extra copies' table is
tui/widgets/copies_table.py's, and a finished reply folds into the one renderable of
tui/widgets/folded_reply.py.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Label, Static

from engine.visible_text import visible
from tui import format as fmt
from tui.telemetry.request_status import PHASE_ORDER, PHASE_WORDS, RequestStatus
from tui.widgets.copies_table import PER_COPY_ROWS, CopyState, copies_table
from tui.widgets.field_line import FieldLine
from tui.widgets.folded_reply import FoldedReply, folded_renderable
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.reply_footer import SumLine, anatomy_fields, footer_fields
from tui.widgets.single_layout import SingleLayout
from tui.widgets.token_latency_view import TimedToken, TokenLatencyView

if TYPE_CHECKING:
    from rich.console import Group
    from textual.app import ComposeResult

    from engine.events import RequestFinished, TokenEvent

StatusSource = Callable[[str, bool], RequestStatus]
"""(request_id, accepted) -> where the request is (from the step samples)."""


def _no_status(request_id: str, accepted: bool) -> RequestStatus:
    return RequestStatus(
        "submitted" if accepted else "sending", "submitted" if accepted else "sending"
    )


@dataclass
class ReplySummary:
    """What the screen needs once a reply is over."""

    text: str
    failed: bool


class ReplyBlock(SingleLayout, Vertical):
    """The primary copy streams into a LiveMarkdown and a TokenLatencyView; extra
    concurrent copies show as one status line each, or counted when there are many, and
    end as one table. A finished reply's footer is followed by its TTFT split, when known.

    Tokens are appended to the LiveMarkdown (append-only: only the last block is rendered
    again), once per screen tick with everything received since the last one, so the
    append lands in the same frame as the status lines instead of costing frames of its
    own.
    """

    DEFAULT_CSS = """
    ReplyBlock .reply-anatomy {
        height: auto;
        color: $text-secondary;
    }
    ReplyBlock .reply-noise {
        height: auto;
        color: $foreground-muted;
        text-style: italic;
        display: none;
    }
    ReplyBlock.-noise .reply-noise {
        display: block;
    }
    """

    def __init__(
        self,
        title: str,
        request_ids: list[str],
        *,
        status: StatusSource | None = None,
        synthetic: bool = False,
        stoppable: bool = True,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id, classes="-streaming -noise" if synthetic else "-streaming")
        self.synthetic = synthetic
        self.stoppable = stoppable
        """Esc stops this reply while it streams (not in a replay): its footer says so."""
        """The reply to a synthetic prompt: its text is noise ("'n'n'n"), its tokens the
        measurement. Its body is folded to one line unless clicked open."""
        self.title = title
        self.copies = [CopyState(rid) for rid in request_ids]
        self.tokens: list[TimedToken] = []
        self.status_of: StatusSource = status or _no_status
        self._text_parts: list[str] = []
        self._flushed = 0  # how many of _text_parts the Markdown widget has been given
        self._made_at = 0.0  # when the engine made the newest token shown (its clock)
        self._dirty = True
        self._latency_mode = False
        self.copies_text: list[str] = []
        self._copies_shown: object = None
        self._folded: FoldedReply | None = None
        self._token_latency = array("d")
        self._token_length = array("L")

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="reply-title")
        yield LiveMarkdown(classes="reply-markdown")
        yield TokenLatencyView(self.tokens, classes="reply-latency")
        yield Static("", classes="reply-noise")
        copies = Static("", classes="reply-copies")
        copies.display = len(self.copies) > 1
        yield copies
        yield FieldLine(classes="reply-footer")
        yield SumLine(classes="reply-anatomy")

    async def on_mount(self) -> None:
        await self.tick()

    # -- from the request workers ----------------------------------------------------------
    @property
    def primary(self) -> CopyState:
        return self.copies[0]

    @property
    def text(self) -> str:
        return "".join(self._text_parts)

    @property
    def done(self) -> bool:
        return all(c.done for c in self.copies)

    @property
    def running_ids(self) -> list[str]:
        return [c.request_id for c in self.copies if not c.done]

    @property
    def footer_text(self) -> str:
        if self._folded is not None:
            return self._folded.footer
        return self.query_one(".reply-footer", FieldLine).plain

    @property
    def anatomy_text(self) -> str:
        """The TTFT split under the footer ("" when not shown)."""
        if self._folded is not None:
            return self._folded.anatomy
        return self.query_one(".reply-anatomy", SumLine).plain

    @property
    def folded(self) -> bool:
        return self._folded is not None

    @property
    def folded_user(self) -> str | None:
        """The user's message folded into this reply, as plain text (None if not)."""
        if self._folded is None or self._folded.user is None:
            return None
        return self._folded.user.plain

    def accepted(self, copy: int) -> None:
        self.copies[copy].accepted = True
        self._dirty = True

    async def add_token(self, copy: int, event: TokenEvent) -> None:
        state = self.copies[copy]
        # After a preemption the engine may produce the same positions again; the reply is
        # append-only, so positions already shown are skipped.
        if event.index < state.received:
            if event.index == 0:
                state.preemptions_seen += 1
            return
        state.received = event.index + len(event.token_ids)
        self._dirty = True
        if copy != 0:
            return
        text = visible(event.text)  # a model's ESC[2J is shown, not obeyed
        self._text_parts.append(text)
        self._made_at = event.time_s
        self.tokens.append(TimedToken(text, event.latency_s, len(self.tokens)))
        # Shown by the next `tick()`: each append re-wraps the growing paragraph and moves
        # the transcript, so doing it per token would cost a full re-layout per token.

    async def finish(self, copy: int, event: RequestFinished) -> None:
        self.copies[copy].finished = event
        await self._after_copy_ended()

    async def fail(self, copy: int, message: str) -> None:
        self.copies[copy].error = message
        await self._after_copy_ended()

    async def _after_copy_ended(self) -> None:
        self._dirty = True
        await self.tick()
        if self.done:
            self.remove_class("-streaming")
            self.query_one(".reply-markdown", LiveMarkdown).settle()

    def noise_line(self) -> str:
        """The one line a folded synthetic body shows instead of its text."""
        n = self.primary.received
        verb = "click to show" if self.has_class("-noise") else "click to fold"
        return f"⟨{fmt.count(n, 'token')} of synthetic output, folded · {verb}⟩"

    def on_click(self) -> None:
        if not self.synthetic:
            return
        self.toggle_class("-noise")
        if self._folded is not None:
            self.query_one(".reply-folded", Static).update(self._folded_renderable())
        else:
            self._show_noise_line()
            self.query_one(".reply-markdown", LiveMarkdown).refresh(layout=True)

    def _show_noise_line(self) -> None:
        if self.synthetic and self._folded is None and self.is_mounted:
            self.query_one(".reply-noise", Static).update(Text(self.noise_line()))

    def summary(self) -> ReplySummary:
        return ReplySummary(self.text, self.primary.error is not None)

    def where(self, copy: CopyState) -> RequestStatus:
        """Where a copy is, in the one vocabulary (see tui/telemetry/request_status.py)."""
        if copy.done:
            return RequestStatus("done", "done")
        return self.status_of(copy.request_id, copy.accepted)

    # -- display ---------------------------------------------------------------------------
    def set_latency_mode(self, on: bool) -> None:
        self._latency_mode = on
        if self._folded is not None:
            self.query_one(".reply-folded", Static).update(self._folded_renderable())
        elif on:
            self.query_one(TokenLatencyView).repaint_all()

    # -- folding ---------------------------------------------------------------------------
    async def fold(self, user: Text | None = None) -> None:
        """Become one Static: a finished reply is read, not streamed into, and its six
        widgets (the Markdown with its rendered lines, the latency view, footer lines)
        cost tens of KiB each plus their render caches, for as long as the session lasts.

        The body is drawn by rich's Markdown renderer, as LiveMarkdown drew it, or, with
        latency colours on, as coloured tokens; the footer and the TTFT split keep their
        words. Colours are the theme's at the time of folding.
        """
        if self._folded is not None or not self.done or not self.is_mounted:
            return
        extra = self.copies[1:]
        # The footer's colour, as the CSS gives it: failed, stopped by the user, or done.
        tone = "text-secondary"
        if self.primary.error is not None:
            tone = "error"
        elif self._stopped():
            tone = "warning"
        self._folded = FoldedReply(
            footer=self.footer_text,
            anatomy=self.anatomy_text,
            copies=copies_table(extra)[0] if extra else None,
            footer_tone=tone,
            user=user,
        )
        # Textual keeps a removed widget's styles cache, with every line it drew, in a
        # 1,024-entry lru_cache: refresh() empties it first, so only empty caches linger.
        for widget in self.walk_children():
            widget.refresh()
        await self.remove_children()
        await self.mount(Static(self._folded_renderable(), classes="reply-folded"))
        # What latency colours need, in two arrays instead of an object per token.
        self._token_latency = array("d", (t.latency_s for t in self.tokens))
        self._token_length = array("L", (len(t.text) for t in self.tokens))
        self.tokens = []
        self._text_parts = [self.text]  # one string instead of one per token
        self._flushed = 1

    def _folded_tokens(self) -> list[TimedToken]:
        text = self.text
        tokens: list[TimedToken] = []
        start = 0
        for i, (latency, length) in enumerate(
            zip(self._token_latency, self._token_length, strict=True)
        ):
            tokens.append(TimedToken(text[start : start + length], latency, i))
            start += length
        return tokens

    def _stopped(self) -> bool:
        finished = self.primary.finished
        return finished is not None and finished.reason == "abort"

    def _folded_renderable(self) -> Group:
        folded = self._folded
        assert folded is not None
        noise = self.synthetic and self.has_class("-noise")
        return folded_renderable(
            folded,
            title=self.title,
            text=self.text,
            tokens=self._folded_tokens() if self._latency_mode and not noise else None,
            colours=self.app.get_css_variables(),
            noise=self.noise_line() if noise else None,
        )

    async def flush(self) -> None:
        """Append the tokens received since the last flush to the Markdown and the
        latency view (append-only: nothing already shown is rendered again)."""
        if self._flushed == len(self._text_parts) or not self.is_mounted or self.folded:
            return
        fresh = "".join(self._text_parts[self._flushed :])
        self._flushed = len(self._text_parts)
        if self._latency_mode:
            self.query_one(TokenLatencyView).sync()
        if fresh:
            self.query_one(".reply-markdown", LiveMarkdown).append_live(fresh, self._made_at)

    async def tick(self) -> None:
        """Show what arrived since the last tick; the screen's timer calls this ~15 times a
        second, so the cost of drawing does not grow with the token rate."""
        await self.flush()
        if not self.is_mounted or self.folded:
            return
        # A request's status moves with the engine's steps, not only with its own events,
        # so it is looked at every tick while streaming; the widgets only change if the
        # words did.
        if not self._dirty and self.done:
            return
        self._dirty = False
        self._show_noise_line()
        p = self.primary
        footer = self.query_one(".reply-footer", FieldLine)
        footer.set_class(p.error is not None, "-error")
        footer.set_class(p.finished is not None and p.finished.reason == "abort", "-aborted")
        footer.set_class(p.finished is not None, "-finished")
        if p.error is not None:
            footer.set_fields((f"✗ {p.error}",))
        elif p.finished is not None:
            prefix = ("■ stopped by you",) if p.finished.reason == "abort" else ()
            footer.set_fields(prefix + footer_fields(p.finished))
            self.query_one(".reply-anatomy", SumLine).set_fields(anatomy_fields(p.finished))
        else:
            where = self.where(p)
            preempted = f" · preempted ×{p.preemptions_seen}" if p.preemptions_seen else ""
            fields: tuple[str, ...]
            if p.received:
                fields = (f"streaming · {fmt.count(p.received, 'token')}{preempted}", where.words)
            else:
                fields = (f"{where.words}…",)
            # While streaming, the footer keeps its line count: no re-layout of the
            # transcript for a changed token count (that would cost a reflow per tick).
            stop = ("Esc stops",) if self.stoppable else ()
            footer.set_fields((*fields, *stop), layout=False)
        if len(self.copies) > 1:
            self._show_copies()

    def _show_copies(self) -> None:
        extra = self.copies[1:]
        box = self.query_one(".reply-copies", Static)
        if all(c.done for c in extra):
            key: object = ("done", tuple(id(c.finished) for c in extra))
            if key == self._copies_shown:
                return
            self._copies_shown = key
            table, self.copies_text = copies_table(extra)
            box.update(table)
            return
        if len(extra) <= PER_COPY_ROWS:
            lines = [c.status(self.where(c)) for c in extra]
        else:
            phases = Counter(self.where(c).phase for c in extra)
            counted = [
                f"{n:,} {PHASE_WORDS[phase]}" for phase in PHASE_ORDER if (n := phases[phase])
            ]
            lines = [f"{len(extra):,} more copies: " + " · ".join(counted)]
        if lines == self.copies_text:
            return
        # Token counts change every tick; only a change of words (a phase) may change
        # how the lines wrap, and only then is the transcript laid out again.
        words = [line.split(" · ")[:2] for line in lines]
        relayout = words != self._copies_shown
        self._copies_shown = words
        self.copies_text = lines
        box.update(Text("\n".join(lines)), layout=relayout)
