"""A folded reply: what a finished ReplyBlock keeps once its widgets are gone, and the one
rich renderable it is drawn as (title, body, copies table, footer, TTFT split)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.color import Color

from tui.widgets.token_latency_view import latency_text

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.console import RenderableType

    from tui.widgets.token_latency_view import TimedToken


@dataclass
class FoldedReply:
    """What a folded reply keeps of the widgets it no longer has."""

    footer: str
    anatomy: str
    copies: Table | None
    footer_tone: str
    user: Text | None = None
    """The message this replied to, folded in with it (one widget less per exchange)."""


def folded_renderable(
    folded: FoldedReply,
    *,
    title: str,
    text: str,
    tokens: list[TimedToken] | None,
    colours: Mapping[str, str],
    noise: str | None = None,
) -> Group:
    """The folded reply as one renderable, in the theme's `colours` (the app's CSS
    variables): its body as Markdown, or, given its `tokens`, in latency colours, or,
    given `noise` (a synthetic prompt's output), as that one line."""
    background = Color.parse(colours.get("background", "black"))

    def style(name: str, flags: str = "") -> Style:
        # Muted theme colours carry an alpha: blended over the background, as drawn.
        colour = (background + Color.parse(colours[name])).hex if name in colours else ""
        return Style.parse(f"{flags} {colour}".strip() or "none")

    body: RenderableType
    if noise is not None:
        body = Text(noise, style("foreground-muted", "italic"))
    elif tokens is not None:
        # As TokenLatencyView's DEFAULT_CSS colours the levels.
        body = latency_text(
            tokens,
            {
                "first": style("accent", "underline"),
                "fast": style("success"),
                "slow": style("warning"),
                "stall": style("error", "bold reverse"),
            },
        )
    else:
        body = RichMarkdown(text)
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
    parts += [Text(title, style("accent", "bold")), body]
    if folded.copies is not None:
        folded.copies.style = style("foreground-muted")
        parts.append(folded.copies)
    parts.append(Text(folded.footer, style(folded.footer_tone)))
    if folded.anatomy:
        parts.append(Text(folded.anatomy, style("text-secondary")))
    return Group(*parts)
