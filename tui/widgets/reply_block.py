"""ReplyBlock: one assistant reply, streamed in, then summed up in a footer of fields."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.color import Color
from textual.containers import Vertical
from textual.widgets import Label, Static

from engine.stats import percentile
from tui import format as fmt
from tui.request_status import PHASE_ORDER, PHASE_WORDS, RequestStatus
from tui.telemetry import anatomy_parts
from tui.widgets.field_line import SEPARATOR, FieldLine, pack
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.single_layout import SingleLayout
from tui.widgets.token_latency_view import TimedToken, TokenLatencyView, latency_text

if TYPE_CHECKING:
    from rich.console import RenderableType
    from textual.app import ComposeResult
    from textual.geometry import Size

    from engine.events import RequestFinished, TokenEvent

REASONS = {"stop": "done", "length": "hit max tokens", "abort": "stopped"}
PER_COPY_ROWS = 3
"""Up to this many extra copies get a line each; more are counted and summed up."""

StatusSource = Callable[[str, bool], RequestStatus]
"""(request_id, accepted) -> where the request is (from the step samples)."""


def footer_fields(ev: RequestFinished) -> tuple[str, ...]:
    """TTFT, median and p99 ITL, tokens/s, prompt and output tokens, and how it ended."""
    itl = list(ev.itl_s)
    itl_part = (
        f"ITL p50 {fmt.ms(percentile(itl, 50))} · p99 {fmt.ms(percentile(itl, 99))}"
        if itl
        else "ITL –"
    )
    rate = ev.output_tokens / ev.e2e_s if ev.e2e_s > 0 else 0.0
    fields = [
        f"TTFT {fmt.ms(ev.ttft_s)}",
        itl_part,
        f"{rate:,.1f} tok/s",
        f"prompt {ev.prompt_tokens:,} · output {fmt.count(ev.output_tokens, 'token')}",
        REASONS.get(ev.reason, ev.reason),
    ]
    if ev.preemptions:
        fields.append(f"preempted ×{ev.preemptions}")
    return tuple(fields)


def footer_line(ev: RequestFinished) -> str:
    return SEPARATOR.join(footer_fields(ev))


def anatomy_fields(ev: RequestFinished) -> tuple[str, ...]:
    """Where the TTFT went, as the terms of one sum, when the engine measured it step by
    step; () otherwise (a remote server, or no token came)."""
    if ev.anatomy is None or ev.ttft_s is None:
        return ()
    return anatomy_parts(ev.anatomy, ev.ttft_s)


PLUS = " + "


class SumLine(FieldLine):
    """A FieldLine of terms: "a + b + c", wrapped between terms, never inside one; a
    wrapped line starts with "+ " so it still reads as the same sum."""

    @property
    def plain(self) -> str:
        return PLUS.join(self.fields)

    def _lines(self, width: int) -> list[str]:
        lines = pack(self.fields, max(1, width - 2), PLUS)
        return [line if i == 0 else "+ " + line for i, line in enumerate(lines)]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width)) if self.fields else 0

    def render(self) -> Text:
        return Text("\n".join(self._lines(self.content_size.width)), end="")


def _no_status(request_id: str, accepted: bool) -> RequestStatus:
    return RequestStatus(
        "submitted" if accepted else "sending", "submitted" if accepted else "sending"
    )


@dataclass
class CopyState:
    """One of the request's concurrent copies, as the reply sees it."""

    request_id: str
    received: int = 0
    accepted: bool = False
    finished: RequestFinished | None = None
    error: str | None = None
    preemptions_seen: int = 0

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    def status(self, where: RequestStatus) -> str:
        if self.error is not None:
            return f"{self.request_id} · failed: {self.error}"
        if self.finished is not None:
            return f"{self.request_id} · {footer_line(self.finished)}"
        tokens = f" · {fmt.count(self.received, 'token')}" if self.received else ""
        return f"{self.request_id} · {where.words}{tokens}"


@dataclass
class FoldedReply:
    """What a folded reply keeps of the widgets it no longer has."""

    footer: str
    anatomy: str
    copies: Table | None
    footer_tone: str
    user: Text | None = None
    """The message this replied to, folded in with it (one widget less per exchange)."""


@dataclass
class ReplySummary:
    """What the screen needs once a reply is over."""

    text: str
    failed: bool


def _num_ms(seconds: float | None) -> str:
    """Milliseconds as a bare number for a table whose header carries the unit."""
    if seconds is None:
        return "–"
    value = seconds * 1000.0
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def copies_table(copies: list[CopyState]) -> tuple[Table, list[str]]:
    """The finished extra copies as one table (and its lines as plain text).

    A few copies get a row each. Many (16 copies of a synthetic prompt) are summed up as
    min / median / max rows, so they do not flood the transcript with footers. Units are
    in the header, so every cell stays on one line in a narrow chat column.
    """
    per_copy = len(copies) <= PER_COPY_ROWS
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    names = ["copy" if per_copy else "", "TTFT ms", "p50 ms", "p99 ms", "tok/s", "out"]
    if per_copy:
        names.append("ended")
    for name in names:
        table.add_column(
            name, justify="left" if name in ("copy", "", "ended") else "right", no_wrap=True
        )
    plain: list[str] = []
    finished = [c.finished for c in copies if c.finished is not None]

    def metrics(ev: RequestFinished) -> tuple[float | None, float | None, float | None, float]:
        itl = list(ev.itl_s)
        rate = ev.output_tokens / ev.e2e_s if ev.e2e_s > 0 else 0.0
        p50 = percentile(itl, 50) if itl else None
        p99 = percentile(itl, 99) if itl else None
        return ev.ttft_s, p50, p99, rate

    if per_copy:
        for c in copies:
            if c.finished is None:
                table.add_row(c.request_id, "", "", "", "", "", f"failed: {c.error}")
                plain.append(f"{c.request_id} · failed: {c.error}")
                continue
            ttft, p50, p99, rate = metrics(c.finished)
            ended = REASONS.get(c.finished.reason, c.finished.reason)
            if c.finished.preemptions:
                ended += f", preempted ×{c.finished.preemptions}"
            table.add_row(
                c.request_id,
                _num_ms(ttft),
                _num_ms(p50),
                _num_ms(p99),
                f"{rate:,.1f}",
                f"{c.finished.output_tokens:,}",
                ended,
            )
            plain.append(f"{c.request_id} · {footer_line(c.finished)}")
        return table, plain

    values = [metrics(ev) for ev in finished]

    def column(i: int) -> list[float]:
        return [float(v[i]) for v in values if v[i] is not None]  # type: ignore[arg-type]

    outs = [ev.output_tokens for ev in finished]
    for label, pct in (("min", 0.0), ("median", 50.0), ("max", 100.0)):

        def pick(xs: list[float], pct: float = pct) -> float | None:
            return percentile(xs, pct) if xs else None

        a_ttft, a_p50, a_p99, a_rate = (pick(column(i)) for i in range(4))
        out = pick([float(o) for o in outs])
        table.add_row(
            label,
            _num_ms(a_ttft),
            _num_ms(a_p50),
            _num_ms(a_p99),
            f"{a_rate:,.1f}" if a_rate is not None else "–",
            f"{out:,.0f}" if out is not None else "–",
        )
        plain.append(
            f"{label} · TTFT {fmt.ms(a_ttft)} · ITL p50 {fmt.ms(a_p50)} · p99 {fmt.ms(a_p99)}"
        )
    reasons = Counter(REASONS.get(ev.reason, ev.reason) for ev in finished)
    failed = sum(1 for c in copies if c.error is not None)
    preempted = sum(1 for ev in finished if ev.preemptions)
    parts = [f"{n:,} {reason}" for reason, n in reasons.most_common()]
    if failed:
        parts.append(f"{failed:,} failed")
    if preempted:
        parts.append(f"{fmt.count(preempted, 'copy', 'copies')} preempted")
    words = f"{len(copies):,} more copies: " + " · ".join(parts)
    table.title = words
    table.title_justify = "left"
    table.title_style = "italic"
    plain.insert(0, words)
    return table, plain


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
    """

    def __init__(
        self,
        title: str,
        request_ids: list[str],
        *,
        status: StatusSource | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id, classes="-streaming")
        self.title = title
        self.copies = [CopyState(rid) for rid in request_ids]
        self.tokens: list[TimedToken] = []
        self.status_of: StatusSource = status or _no_status
        self._text_parts: list[str] = []
        self._flushed = 0  # how many of _text_parts the Markdown widget has been given
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
        self._text_parts.append(event.text)
        self.tokens.append(TimedToken(event.text, event.latency_s, len(self.tokens)))
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

    def summary(self) -> ReplySummary:
        return ReplySummary(self.text, self.primary.error is not None)

    def where(self, copy: CopyState) -> RequestStatus:
        """Where a copy is, in the one vocabulary (see tui/request_status.py)."""
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
        colours = self.app.get_css_variables()

        background = Color.parse(colours.get("background", "black"))

        def style(name: str, flags: str = "") -> Style:
            # Muted theme colours carry an alpha: blended over the background, as drawn.
            colour = (background + Color.parse(colours[name])).hex if name in colours else ""
            return Style.parse(f"{flags} {colour}".strip() or "none")

        body: RenderableType
        if self._latency_mode:
            # As TokenLatencyView's DEFAULT_CSS colours the levels.
            body = latency_text(
                self._folded_tokens(),
                {
                    "first": style("accent", "underline"),
                    "fast": style("success"),
                    "slow": style("warning"),
                    "stall": style("error", "bold reverse"),
                },
            )
        else:
            body = RichMarkdown(self.text)
        parts: list[RenderableType] = []
        if folded.user is not None:
            # As the chat's .user-message: indented 6, a bar, a tinted band.
            band = (background.blend(Color.parse(colours.get("primary", "blue")), 0.15)).hex
            message = Table.grid(expand=True)
            message.add_column(width=6)
            message.add_column(width=1, style=style("primary"))
            message.add_column(ratio=1, style=Style(bgcolor=band))
            for line in folded.user.split("\n"):
                message.add_row("", "▌", Text.assemble(" ", line))
            parts += [Text(""), message, Text("")]
        parts += [Text(self.title, style("accent", "bold")), body]
        if folded.copies is not None:
            folded.copies.style = style("foreground-muted")
            parts.append(folded.copies)
        parts.append(Text(folded.footer, style(folded.footer_tone)))
        if folded.anatomy:
            parts.append(Text(folded.anatomy, style("text-secondary")))
        return Group(*parts)

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
            self.query_one(".reply-markdown", LiveMarkdown).append_live(fresh)

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
            footer.set_fields((*fields, "Esc stops"), layout=False)
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
