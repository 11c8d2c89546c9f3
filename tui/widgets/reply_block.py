"""ReplyBlock: one assistant reply, streamed in, then summed up in a one-line footer."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static

from engine.events import RequestFinished, TokenEvent
from engine.stats import percentile
from tui import format as fmt
from tui.widgets.token_latency_view import TimedToken, TokenLatencyView

REASONS = {"stop": "done", "length": "hit max tokens", "abort": "stopped"}


def footer_line(ev: RequestFinished) -> str:
    """TTFT, median and p99 ITL, tokens/s, prompt and output tokens, and how it ended."""
    itl = list(ev.itl_s)
    itl_part = (
        f"ITL p50 {fmt.ms(percentile(itl, 50))} · p99 {fmt.ms(percentile(itl, 99))}"
        if itl
        else "ITL –"
    )
    rate = ev.output_tokens / ev.e2e_s if ev.e2e_s > 0 else 0.0
    parts = [
        f"TTFT {fmt.ms(ev.ttft_s)}",
        itl_part,
        f"{rate:,.1f} tok/s",
        f"prompt {ev.prompt_tokens:,} · output {ev.output_tokens:,} tok",
        REASONS.get(ev.reason, ev.reason),
    ]
    if ev.preemptions:
        parts.append(f"preempted ×{ev.preemptions}")
    return " │ ".join(parts)


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

    def status(self) -> str:
        if self.error is not None:
            return f"{self.request_id} · failed: {self.error}"
        if self.finished is not None:
            return f"{self.request_id} · {footer_line(self.finished)}"
        if self.received:
            again = f" · preempted ×{self.preemptions_seen}" if self.preemptions_seen else ""
            return f"{self.request_id} · streaming · {self.received:,} tok{again}"
        return f"{self.request_id} · {'queued for KV blocks' if self.accepted else 'sending'}…"


@dataclass
class ReplySummary:
    """What the screen needs once a reply is over."""

    text: str
    aborted: bool
    failed: bool
    copies: list[CopyState] = field(default_factory=list)


class ReplyBlock(Vertical):
    """The primary copy streams into a Markdown widget and a TokenLatencyView; extra
    concurrent copies show as one status line each.

    Tokens are appended with `Markdown.append` (append-only: only the last block is parsed
    again), once per screen tick with everything received since the last one. That is
    MarkdownStream's coalescing, done on the screen's clock: the append then lands in the
    same frame as the plots and status lines, instead of costing frames of its own.
    """

    def __init__(self, title: str, request_ids: list[str], *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-streaming")
        self.title = title
        self.copies = [CopyState(rid) for rid in request_ids]
        self.tokens: list[TimedToken] = []
        self._text_parts: list[str] = []
        self._flushed = 0  # how many of _text_parts the Markdown widget has been given
        self._dirty = True
        self._latency_mode = False

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="reply-title")
        yield Markdown(classes="reply-markdown")
        yield TokenLatencyView(self.tokens, classes="reply-latency")
        copies = Static("", classes="reply-copies")
        copies.display = len(self.copies) > 1
        yield copies
        yield Static("", classes="reply-footer")

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

    def summary(self) -> ReplySummary:
        p = self.primary
        aborted = p.finished is not None and p.finished.reason == "abort"
        return ReplySummary(self.text, aborted, p.error is not None, list(self.copies))

    # -- display ---------------------------------------------------------------------------
    def set_latency_mode(self, on: bool) -> None:
        self._latency_mode = on
        if on:
            self.query_one(TokenLatencyView).repaint_all()

    async def flush(self) -> None:
        """Append the tokens received since the last flush to the Markdown and the
        latency view (append-only: nothing already shown is rendered again)."""
        if self._flushed == len(self._text_parts) or not self.is_mounted:
            return
        fresh = "".join(self._text_parts[self._flushed :])
        self._flushed = len(self._text_parts)
        if self._latency_mode:
            self.query_one(TokenLatencyView).sync()
        if fresh:
            await self.query_one(".reply-markdown", Markdown).append(fresh)

    async def tick(self) -> None:
        """Show what arrived since the last tick; the screen's timer calls this ~15 times a
        second, so the cost of drawing does not grow with the token rate."""
        await self.flush()
        if not self._dirty or not self.is_mounted:
            return
        self._dirty = False
        p = self.primary
        footer = self.query_one(".reply-footer", Static)
        footer.set_class(p.error is not None, "-error")
        footer.set_class(p.finished is not None and p.finished.reason == "abort", "-aborted")
        footer.set_class(p.finished is not None, "-finished")
        # While streaming, the status lines keep their height: no re-layout of the
        # transcript for a changed token count (that would cost a full reflow per tick).
        if p.error is not None:
            footer.update(Text(f"✗ {p.error}"))
        elif p.finished is not None:
            prefix = "■ stopped by you │ " if p.finished.reason == "abort" else ""
            footer.update(Text(prefix + footer_line(p.finished)))
        elif p.received:
            preempted = f" · preempted ×{p.preemptions_seen}" if p.preemptions_seen else ""
            footer.update(
                Text(f"streaming · {p.received:,} tokens{preempted} · Esc stops"), layout=False
            )
        else:
            waiting = "waiting for KV blocks" if p.accepted else "sending"
            footer.update(Text(f"{waiting}… · Esc stops"))
        if len(self.copies) > 1:
            lines = [c.status() for c in self.copies[1:]]
            streaming = all(c.received and not c.done for c in self.copies[1:])
            copies = self.query_one(".reply-copies", Static)
            copies.update(Text("\n".join(lines)), layout=not streaming)
