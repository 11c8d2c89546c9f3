"""A long chat stays cheap: old replies fold into static text, the footer does not keep
every key it drew, and the pause between replies does not grow with the session.

The memory itself is measured by `benchmarks/ui_lag.py --long`; these tests pin down the
mechanisms that benchmark depends on.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

from held_clock import HeldClock
from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey  # not re-exported
from tui_helpers import (
    WIDE,
    HoldingClock,
    engine_ready,
    make_app,
    reply_done,
    send_chat,
    settle,
    wait_until,
)

from engine.fake import FakeConfig
from tui.app import KvscopeApp
from tui.gc_pauses import FULL_GROWTH, STREAM_COLLECT_S, GcPolicy
from tui.widgets.chat_pane import LIVE_REPLIES

if TYPE_CHECKING:
    import pytest
    from textual.pilot import Pilot

    from tui.widgets.reply_block import ReplyBlock

WORDS = tuple(f"w{i}" for i in range(40))


async def chat(pilot: Pilot[int], replies: int) -> None:
    for n in range(replies):
        await send_chat(pilot, f"message {n}")
        await reply_done(pilot)
    await settle(pilot)


async def first_reply_folded(pilot: Pilot[int]) -> ReplyBlock:
    """Three replies, once the engine is up; the first is folded by then."""
    await engine_ready(pilot)
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    await chat(pilot, 3)
    first = app.main_screen.chat.replies()[0]
    assert first.folded
    return first


def body(reply: ReplyBlock) -> object:
    static = reply.query_one(".reply-folded", Static)
    group = static.content
    assert isinstance(group, Group)
    parts = list(group.renderables)
    titles = [i for i, p in enumerate(parts) if isinstance(p, Text) and p.plain == reply.title]
    assert len(titles) == 1
    return parts[titles[0] + 1]  # right after the title


async def test_older_replies_fold_into_one_static_and_keep_their_words() -> None:
    app: KvscopeApp = make_app(FakeConfig(reply_words=WORDS))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        await chat(pilot, 2)
        first = main.chat.replies()[0]
        footer, anatomy, text = first.footer_text, first.anatomy_text, first.text
        assert not first.folded  # the newest two stay whole widgets
        widgets_before = len(list(app.screen.walk_children()))
        await chat(pilot, 2)
        replies = main.chat.replies()
        assert len(replies) == 4
        assert [r.folded for r in replies] == [True, True, False, False]
        assert len(replies) - LIVE_REPLIES == 2
        # One widget where there were six, and the same words.
        assert [type(c).__name__ for c in first.children] == ["Static"]
        assert first.footer_text == footer
        assert first.anatomy_text == anatomy
        assert first.text == text
        transcript = main.chat.transcript_text()
        assert footer in transcript and text in transcript
        # Two more exchanges, and the two before them folded: the screen holds what it
        # held, plus two widgets (the reply and its one Static, the message folded in)
        # per folded exchange.
        widgets_after = len(list(app.screen.walk_children()))
        assert widgets_after - widgets_before == 2 * 2
        assert first.folded_user == "message 0"
        assert transcript.index("message 0") < transcript.index(first.title)
        assert isinstance(body(first), RichMarkdown)


async def test_latency_colours_reach_folded_replies_too() -> None:
    app: KvscopeApp = make_app(FakeConfig(reply_words=WORDS, stalls=((5, 0.5),)))
    async with app.run_test(size=WIDE) as pilot:
        first = await first_reply_folded(pilot)
        await pilot.press("ctrl+l")
        await settle(pilot)
        coloured = body(first)
        assert isinstance(coloured, Text)
        assert coloured.plain == first.text
        # Token 5 stalled: its span has the stall style (bold reverse), no other has.
        stalled = [span for span in coloured.spans if "reverse" in str(span.style)]
        assert len(stalled) == 1
        start = sum(len(WORDS[i]) + (1 if i else 0) for i in range(5))
        assert stalled[0].start == start
        await pilot.press("ctrl+l")
        await settle(pilot)
        assert isinstance(body(first), RichMarkdown)


async def test_the_footer_forgets_the_keys_it_no_longer_shows() -> None:
    app: KvscopeApp = make_app(FakeConfig(reply_words=WORDS))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await chat(pilot, 4)  # each reply changes the bindings twice: the footer recomposes
        footer = app.screen.query_one(Footer)
        watchers = getattr(footer, "__watchers", {}).get("compact", [])
        shown = len(footer.query(FooterKey))
        assert shown > 0
        assert len(watchers) <= shown + 2  # Textual's own footer kept ~6 more per change


def footer_keys(app: KvscopeApp) -> list[tuple[str, bool]]:
    """The footer's keys as drawn: each key's action and whether it is dimmed."""
    return sorted((k.action, k.disabled) for k in app.screen.query_one(Footer).query(FooterKey))


def keys_to_show(app: KvscopeApp) -> list[tuple[str, bool]]:
    """The keys the screen's bindings say the footer shows now: one per action (the first
    binding of each), and the command palette's."""
    first: dict[str, bool] = {}
    for _, b, on, _ in app.screen.active_bindings.values():
        if b.show or b.key == app.COMMAND_PALETTE_BINDING:
            first.setdefault(b.action, not on)
    return sorted(first.items())


async def test_the_footer_keeps_its_keys_until_what_it_shows_changes() -> None:
    clock = HoldingClock(hold_after=3)
    app: KvscopeApp = make_app(FakeConfig(reply_words=WORDS), clock=clock)
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        drawn = list(app.screen.query_one(Footer).query(FooterKey))
        assert footer_keys(app) == keys_to_show(app)
        app.screen.refresh_bindings()  # Textual recomposes the footer: nothing new to show
        await settle(pilot)
        now = list(app.screen.query_one(Footer).query(FooterKey))
        assert len(now) == len(drawn) and all(a is b for a, b in zip(now, drawn, strict=True))
        idle = footer_keys(app)
        await send_chat(pilot, "hello")  # a reply on its way changes the keys: they follow
        await wait_until(pilot, lambda: app.main_screen.busy and clock.holding)
        await settle(pilot)
        assert footer_keys(app) == keys_to_show(app) != idle
        clock.release()
        await reply_done(pilot)
        assert footer_keys(app) == keys_to_show(app) == idle


def test_gc_between_replies_walks_the_whole_heap_only_when_it_grew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    frozen = [100_000]
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))

    def collect(*args: object) -> int:
        calls.append("collect")
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "get_freeze_count", lambda: frozen[0])
    monkeypatch.setattr(gc, "set_threshold", lambda *a: None)
    policy = GcPolicy()
    policy.started()
    assert calls == ["unfreeze", "collect", "freeze"]  # the first one is full
    calls.clear()
    frozen[0] = int(100_000 * (1 + FULL_GROWTH / 2))
    policy.idle()  # a reply ended, the heap grew a little: young objects only
    assert calls == ["collect", "freeze"]
    calls.clear()
    frozen[0] = int(100_000 * (1 + FULL_GROWTH)) + 1
    policy.idle()  # grew by more than a quarter: one full collection
    assert calls == ["unfreeze", "collect", "freeze"]
    calls.clear()
    policy.idle(full=True)  # a new chat: the whole old transcript is garbage
    assert calls == ["unfreeze", "collect", "freeze"]
    # While a reply streams: now and then what is not frozen is collected, and the
    # survivors frozen (tried: freezing alone, cheaper by a collection of a few ms a
    # second, kept about 6 MiB more garbage over a 20 s stream).
    clock = HeldClock(1_000.0)
    monkeypatch.setattr(time, "monotonic", clock)
    policy.idle()
    calls.clear()
    clock.now += STREAM_COLLECT_S / 2
    policy.streaming_tick()
    assert calls == []
    clock.now += STREAM_COLLECT_S
    policy.streaming_tick()
    assert calls == ["collect", "freeze"]


async def test_folded_replies_take_the_new_theme_colours() -> None:
    app: KvscopeApp = make_app(FakeConfig(reply_words=WORDS), theme="kvscope-dark")
    async with app.run_test(size=WIDE) as pilot:
        first = await first_reply_folded(pilot)

        def title_colour() -> str:
            static = first.query_one(".reply-folded", Static)
            group = static.content
            assert isinstance(group, Group)
            titles = [
                p for p in group.renderables if isinstance(p, Text) and p.plain == first.title
            ]
            return str(titles[0].style)

        dark = title_colour()
        app.theme = "kvscope-light"
        await settle(pilot)
        assert title_colour() != dark
