"""The streaming reply's Markdown: where blocks end, what a frame repaints and lays out,
and that it ends looking exactly like rich's Markdown (what a folded reply shows).

LiveMarkdown exists to keep frames small under a fast stream (benchmarks/ui_lag.py), so
each test checks both halves: the screen shows the text, and no more than the changed
part was drawn again or laid out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import pytest
from rich.markdown import Markdown as RichMarkdown
from rich.syntax import Syntax
from textual import _compositor, messages
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input, Static
from tui_helpers import engine_ready, make_app, reply_done, screen_lines, wait_until

from engine.clock import RealClock
from engine.fake import FakeConfig, FakeEngine
from tui.widgets.chat_pane import ChatPane
from tui.widgets.live_markdown import (
    CODE_CHUNK,
    RESERVE_MIN,
    RESERVE_SHARE,
    BlockSplitter,
    LiveMarkdown,
)

if TYPE_CHECKING:
    from collections.abc import Set as AbstractSet
    from pathlib import PurePath

DOCUMENT = """# Title

Some *intro* paragraph with `code` and more words, enough to wrap at this width.

1. first
2. second

3. third, a loose list

   still the third item

```python
def f(x):

    return x
```

    indented code

    more of it

> a quote
> on two lines

- a
- b

Last line."""


def blocks_of(text: str, chunk: int) -> tuple[list[str], str]:
    """The finished blocks and the live rest, fed `chunk` characters at a time."""
    splitter = BlockSplitter()
    blocks: list[str] = []
    for end in range(chunk, len(text) + chunk, chunk):
        blocks += splitter.feed(text[:end])
    return blocks, text[splitter.stable_end :]


def test_blocks_end_at_blank_lines_but_not_inside_fences_lists_or_indented_code() -> None:
    for chunk in (1, 7, len(DOCUMENT)):
        blocks, live = blocks_of(DOCUMENT, chunk)
        assert [block.split("\n")[0] for block in blocks] == [
            "# Title",
            "Some *intro* paragraph with `code` and more words, enough to wrap at this width.",
            "1. first",
            "```python",
            "    indented code",
            "> a quote",
        ]
        assert "3. third" in blocks[2] and "still the third item" in blocks[2]
        assert "    return x\n```" in blocks[3]
        assert "more of it" in blocks[4]
        # "Last line." is not a whole line yet: it does not end the list before it.
        assert live == "- a\n- b\n\nLast line."
        assert "\n".join(blocks) + "\n" + live == DOCUMENT  # the blank lines between


def test_a_paragraph_is_held_back_until_a_line_shows_it_ended() -> None:
    splitter = BlockSplitter()
    assert splitter.feed("One paragraph.\n\n") == []  # the next line may be a list item
    assert splitter.feed("One paragraph.\n\n Two, after a space.\n") == ["One paragraph.\n"]
    assert splitter.stable_end == len("One paragraph.\n\n")


class Transcript(App[None]):
    CSS_PATH: ClassVar[list[str | PurePath]] = []
    CSS = "LiveMarkdown, Static { margin: 0; padding: 0; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield LiveMarkdown(id="live")
            yield Static(id="plain")


async def test_text_that_comes_before_the_first_layout_gets_the_same_room() -> None:
    """A reply's first tokens can reach the widget before it is laid out (a fast engine, a
    busy machine): the room kept under them is the same as when they come after, or the
    screen depends on which came first (the 160x48 cached-blocks snapshot did)."""
    async with Transcript().run_test(size=(60, 40)) as pilot:
        after = pilot.app.query_one("#live", LiveMarkdown)
        await pilot.pause()
        after.append_live("Three short tokens", 0.0)
        early = LiveMarkdown()
        early.append_live("Three short tokens", 0.0)  # not mounted: no width yet
        await pilot.app.query_one(VerticalScroll).mount(early)
        await pilot.pause()
        await pilot.pause()
        assert after.text_lines == early.text_lines == 1
        assert after.reserved > after.text_lines
        assert (early.reserved, early.outer_size.height) == (
            after.reserved,
            after.outer_size.height,
        )


FENCES_WITHOUT_BLANKS = "```python\na = 1\n```\nText between.\n```js\nlet b = 2;\n"


@pytest.mark.parametrize("document", [DOCUMENT, FENCES_WITHOUT_BLANKS], ids=["mixed", "fences"])
async def test_streamed_in_pieces_it_looks_like_richs_markdown_of_the_whole_text(
    document: str,
) -> None:
    app = Transcript()
    async with app.run_test(size=(50, 80)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        plain = app.query_one("#plain", Static)
        plain.display = False
        for start in range(0, len(document), 5):
            live.append_live(document[start : start + 5], start / 100)
            await pilot.pause()
        live.settle()
        await pilot.pause()
        rows = live.outer_size.height
        assert rows == live.text_lines
        streamed = screen_lines(app, rows)
        plain.update(RichMarkdown(document))
        plain.display = True
        live.display = False
        await pilot.pause()
        assert plain.outer_size.height == rows
        assert screen_lines(app, rows) == streamed
        assert any(("def f(x):" in line or "let b = 2;" in line) for line in streamed)


def marked_rows(widget: LiveMarkdown) -> set[int]:
    return {y for region in widget._repaint_regions for y in region.line_range}


class CountingReflows:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = _compositor.Compositor.reflow

        def reflow(compositor: _compositor.Compositor, *args: object) -> object:
            self.count += 1
            return real(compositor, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(_compositor.Compositor, "reflow", reflow)


class AttributedReflows(CountingReflows):
    """Reflows, each with the widgets that asked for a layout since the one before (the
    screen's Layout messages): what caused it, to tell a reply's layouts from the rest."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: list[Widget] = []
        self.causes: list[tuple[Widget, ...]] = []
        real_layout = Screen._on_layout

        async def on_layout(screen: Screen[object], message: messages.Layout) -> None:
            assert isinstance(message.widget, Widget)
            self.asked.append(message.widget)
            await real_layout(screen, message)

        monkeypatch.setattr(Screen, "_on_layout", on_layout)
        super().__init__(monkeypatch)
        counted = _compositor.Compositor.reflow

        def reflow(compositor: _compositor.Compositor, *args: object) -> object:
            self.causes.append(tuple(self.asked))
            self.asked.clear()
            return counted(compositor, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(_compositor.Compositor, "reflow", reflow)

    def reset(self) -> None:
        self.count = 0
        self.causes.clear()

    def others(self, path: AbstractSet[object]) -> int:
        """Reflows that no widget of `path` asked for: another widget's, or Textual's own."""
        return sum(1 for asked in self.causes if path.isdisjoint(asked))


async def test_appends_that_fit_repaint_their_rows_and_each_step_is_one_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reflows = CountingReflows(monkeypatch)
    app = Transcript()
    words = [f"word{i:03d}" + ("\n\n" if i % 40 == 39 else " ") for i in range(200)]
    async with app.run_test(size=(60, 40)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        app.query_one("#plain", Static).display = False
        now = 0.0
        live.append_live(words[0], now)
        await pilot.pause()
        reflows.count = 0
        steps = 0
        for word in words[1:]:
            now += 0.05
            reserved = live.reserved
            stable_rows = len(live._stable)
            pending = marked_rows(live)  # a layout's repaint may not be drawn yet
            live.append_live(word, now)
            if live.reserved != reserved:
                steps += 1
            else:
                # What the append changed: the live block's rows, nothing above them.
                rows = marked_rows(live) - pending
                assert not rows or min(rows) >= stable_rows
            await pilot.pause()
        assert live.text_lines > 40 // RESERVE_SHARE  # streamed past the biggest step
        assert len(live._stable) > 0  # and past a few paragraphs
        # Each step of the reserve is one layout; nothing else lays out (a new paragraph
        # included), and no second layout follows a step (tui/widgets/single_layout.py).
        assert 1 <= steps <= 8
        assert reflows.count == steps
        assert live.outer_size.height > live.text_lines  # room under the text
        live.settle()
        await pilot.pause()
        assert live.outer_size.height == live.text_lines


async def test_the_room_follows_the_rate_the_text_grows_and_the_screen() -> None:
    app = Transcript()
    now = 0.0
    async with app.run_test(size=(80, 24)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        app.query_one("#plain", Static).display = False

        async def stream(words: int, seconds_per_word: float) -> None:
            nonlocal now
            for i in range(words):
                now += seconds_per_word
                live.append_live(f" word{i:03d}", now)
                await pilot.pause()

        # Fast (100 words a second, about 11 lines a second): as much as half the screen.
        await stream(300, 0.01)
        assert live._step_lines == 24 // RESERVE_SHARE
        room = live.reserved - live.text_lines
        assert 1 <= room <= 24 // RESERVE_SHARE
        # Slow (a word every 2 s, a line in ~16 s): the smallest step.
        await stream(40, 2.0)
        assert live._step_lines == RESERVE_MIN
        # Moderate (a line a second): two seconds' worth.
        await stream(60, 1 / 9)
        assert 2 <= live._step_lines <= 3


class ChatApp(App[None]):
    def compose(self) -> ComposeResult:
        yield ChatPane()


async def test_the_transcript_shows_its_scrollbar_once_a_reply_overflows_it() -> None:
    # The transcript skips Textual's second layout after a growth, except when it first
    # overflows (tui/widgets/chat_pane.py). The layout count is checked in the full app,
    # below; this small app does not run that second layout either way.
    async with ChatApp().run_test(size=(60, 40)) as pilot:
        chat = pilot.app.query_one(ChatPane)
        transcript = chat.transcript
        await chat.add_user_message("Tell me a long story.")
        await pilot.pause()
        assert not transcript.show_vertical_scrollbar
        reply = await chat.add_reply("assistant · r1", ["r1"])
        live = reply.query_one(LiveMarkdown)
        await pilot.pause()
        for i in range(150):
            live.append_live(f"word{i:03d} ", i * 0.05)
            await pilot.pause()
        assert live.text_lines > transcript.container_size.height  # it overflowed...
        assert transcript.show_vertical_scrollbar  # ...and the scrollbar shows
        assert transcript.vertical_scrollbar in pilot.app.screen._compositor.visible_widgets


async def test_in_the_app_a_growing_reply_costs_one_layout_per_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Textual lays out again after any change of a widget's virtual size; in the full app
    # that doubled every step of the reserve (the transcript's, tui/widgets/chat_pane.py;
    # the reply's, tui/widgets/single_layout.py).
    reflows = AttributedReflows(monkeypatch)
    steps = 0
    real_step = LiveMarkdown._next_step

    def counting_step(live: LiveMarkdown, now: float) -> int:
        nonlocal steps
        steps += 1
        return real_step(live, now)

    monkeypatch.setattr(LiveMarkdown, "_next_step", counting_step)
    words = tuple(f"w{i}" + ("\n\n" if i % 50 == 49 else "") for i in range(2000))
    fast = FakeConfig(
        max_model_len=4096,
        total_blocks=512,
        decode_step_s=0.002,
        prefill_base_s=0.001,
        reply_words=words,
    )
    app = make_app(engine=FakeEngine(fast, clock=RealClock()))
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.query_one("#max-tokens", Input).value = "2000"
        await pilot.pause()
        await main.send("Tell me a long story.", synthetic=False)
        reply = main.current
        assert reply is not None
        transcript = main.chat.transcript
        # Past the stream's start (the footer's keys change, the block map fills) and the
        # transcript's first overflow (its scrollbar appears, narrowing the reply).
        await wait_until(
            pilot,
            lambda: reply.primary.received >= 300 and transcript.show_vertical_scrollbar,
            what="300 tokens and a scrollbar",
            progress=lambda: reply.primary.received,
        )
        await pilot.pause()
        reflows.reset()
        steps = 0
        await wait_until(
            pilot,
            lambda: reply.primary.received >= 1800,
            what="1,800 tokens",
            progress=lambda: reply.primary.received,
        )
        assert steps >= 5
        # The reply's layouts are those the live text, the reply or the transcript asked
        # for: one per step. The rest (the block map gaining a row, a label that widened)
        # are the app's other widgets, more of them the longer the stream takes on a real
        # clock: counted in this run, not a fixed few. Without the transcript's override
        # this was 18 layouts for 8 steps (the transcript's virtual size asked again).
        live = reply.query_one(LiveMarkdown)
        path = {live, *live.ancestors_with_self[: live.ancestors_with_self.index(transcript) + 1]}
        others = reflows.others(path)
        assert reflows.count <= steps + others, (reflows.count, steps, others, reflows.causes)
        main.action_stop()
        await reply_done(pilot)


async def test_an_open_code_fence_is_highlighted_a_chunk_at_a_time_and_looks_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code = "Some code:\n\n```python\n" + "".join(
        f"def f{i}(x):\n    return x * {i}  # note {i}\n" for i in range(60)
    )
    highlighted = 0  # lines handed to the highlighter, over the whole stream
    real_highlight = Syntax.highlight

    def counting(syntax: Syntax, code: str, *args: object) -> object:
        nonlocal highlighted
        highlighted += code.count("\n") + 1
        return real_highlight(syntax, code, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Syntax, "highlight", counting)
    app = Transcript()
    async with app.run_test(size=(60, 160)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        plain = app.query_one("#plain", Static)
        plain.display = False
        appends = 0
        for start in range(0, len(code), 40):
            live.append_live(code[start : start + 40], start / 400)
            appends += 1
            await pilot.pause()
        # Each append highlights the lines after the last whole chunk, and at most one
        # new chunk, not the whole fence again (that was 4,008 lines for these 62 appends).
        assert CODE_CHUNK <= 32
        assert highlighted <= appends * (CODE_CHUNK + 2) + 120
        live.settle()
        await pilot.pause()
        rows = live.outer_size.height
        assert rows > 120
        streamed = screen_lines(app, rows)
        plain.update(RichMarkdown(code))  # the fence still open: rich draws it to the end
        plain.display = True
        live.display = False
        await pilot.pause()
        assert plain.outer_size.height == rows
        assert screen_lines(app, rows) == streamed
