"""What a frame repaints: border titles, the block map's rows, a streaming reply's text.

These widgets exist to keep frames small under a fast stream (benchmarks/ui_lag.py). Each
test checks both halves: the screen shows the new state, and no more than the changed
part was drawn again or laid out.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, ClassVar

from textual import _compositor
from textual.app import App, ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static
from tui_helpers import block_sample

from engine.events import RequestBlocks
from tui.widgets.box_titles import retitle
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.live_markdown import (
    MIN_SPARE,
    RESERVE_MIN,
    RESERVE_SHARE,
    LiveMarkdown,
    LiveParagraph,
)

if TYPE_CHECKING:
    from pathlib import PurePath

    import pytest
    from textual.widget import Widget


def screen_lines(app: App[None]) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


class BoxApp(App[None]):
    CSS = "#box { border: round red; height: 7; } Static { height: 3; }"

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Static("inside")


def repainted_rows(widget: Widget) -> list[int]:
    """The rows of `widget` (outer, from its top border) marked for the next repaint."""
    return sorted({y for region in widget._repaint_regions for y in region.line_range})


async def test_retitle_repaints_the_border_row_only_and_nothing_when_unchanged() -> None:
    app = BoxApp()
    async with app.run_test(size=(40, 10)) as pilot:
        box = app.query_one("#box")
        retitle(box, "KV usage · now 10%", "[$primary]⣿[/] used")
        await pilot.pause()
        lines = screen_lines(app)
        assert "KV usage · now 10%" in lines[0]
        assert "⣿ used" in lines[6]
        retitle(box, "KV usage · now 10%", "[$primary]⣿[/] used")
        assert repainted_rows(box) == []  # the same words: nothing to repaint
        await pilot.pause()
        retitle(box, "KV usage · now 12%", None)
        assert repainted_rows(box) == [0]  # the top border row, not the box
        await pilot.pause()
        assert "KV usage · now 12%" in screen_lines(app)[0]
        # A change of colour alone is a change, and repaints the bottom row.
        retitle(box, None, "[$error]⣿[/] used")
        assert repainted_rows(box) == [6]
        await pilot.pause()
        lines = screen_lines(app)
        assert "KV usage · now 12%" in lines[0]
        assert "⣿ used" in lines[6]
        # The same conversion as Textual's own setter.
        converted = box.render_str("KV usage · now 12%").expand_tabs(4).split()[0]
        assert box._border_title == converted
        assert box._border_title.spans == converted.spans


class MapApp(App[None]):
    def __init__(self, block_map: KvBlockMap) -> None:
        super().__init__()
        self.block_map = block_map

    def compose(self) -> ComposeResult:
        yield self.block_map


async def test_block_map_repaints_changed_rows_and_the_screen_matches_a_full_draw() -> None:
    block_map = KvBlockMap()
    rng = random.Random(7)
    total = 200
    async with MapApp(block_map).run_test(size=(30, 20)) as pilot:
        held: dict[str, list[int]] = {"a": [0, 1], "b": [2]}
        free = list(range(3, total))
        for _ in range(40):
            # Requests grow by a block or two, sometimes one ends and another starts.
            for ids in held.values():
                for _ in range(rng.randint(0, 2)):
                    if free:
                        ids.append(free.pop(rng.randrange(len(free))))
            if rng.random() < 0.2:
                gone = rng.choice(sorted(held))
                free.extend(held.pop(gone))
                held[f"r{rng.randint(0, 999)}"] = [free.pop(0)]
            blocks = tuple(
                RequestBlocks(rid, tuple(ids), 16 * len(ids)) for rid, ids in sorted(held.items())
            )
            block_map.show_sample(block_sample(blocks, total))
            await pilot.pause()
            shown = screen_lines(app=block_map.app)[: block_map.size.height]
            expected = block_map.as_text().plain.splitlines()
            assert [line.rstrip() for line in shown] == [line.rstrip() for line in expected]


async def test_block_map_step_marks_only_the_rows_that_changed() -> None:
    block_map = KvBlockMap()
    async with MapApp(block_map).run_test(size=(30, 20)) as pilot:
        first = (RequestBlocks("a", (0, 1), 32),)
        block_map.show_sample(block_sample(first, 120))
        await pilot.pause()
        assert block_map.size.width == 30
        # Block 35 is on the second grid row; the legend's "a" entry and free count change.
        assert block_map.blocks_per_cell(30) == 1
        block_map.show_sample(block_sample((RequestBlocks("a", (0, 1, 35), 48),), 120))
        rows = sorted(y for region in block_map._repaint_regions for y in region.line_range)
        grid_rows = 120 // 30
        assert 1 in rows
        assert 0 not in rows
        assert grid_rows in rows  # the legend
        assert all(y == 1 or y >= grid_rows for y in rows)
        await pilot.pause()


class Transcript(App[None]):
    CSS_PATH: ClassVar[list[str | PurePath]] = []
    CSS = "LiveMarkdown, Markdown { margin: 0; padding: 0; } MarkdownParagraph { margin: 0; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield LiveMarkdown(id="live")
            yield Markdown(id="plain")


async def test_streaming_text_lays_out_once_per_reserve_and_settles_to_the_plain_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reflows = 0
    real_reflow = _compositor.Compositor.reflow

    def counting_reflow(self: _compositor.Compositor, *args: object) -> object:
        nonlocal reflows
        reflows += 1
        return real_reflow(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_compositor.Compositor, "reflow", counting_reflow)
    app = Transcript()
    words = [f"word{i:03d}" for i in range(120)]  # one paragraph of about 22 lines at 60
    async with app.run_test(size=(60, 40)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        plain = app.query_one("#plain", Markdown)
        plain.display = False
        await live.append_live(words[0])
        await pilot.pause()
        await live.append_live(" " + words[1])
        await pilot.pause()
        reflows = 0
        for word in words[2:]:
            await live.append_live(" " + word)
            await pilot.pause()
        block = live.query_one(LiveParagraph)
        lines = block.get_content_height(live.size, live.size, block.content_size.width)
        assert lines > 40 // RESERVE_SHARE  # streamed past the biggest step
        # A fast stream: each step twice the one before, up to a third of the screen
        # (4, 8, 13 lines), so a handful of layouts in all, not one per append (118 appends).
        assert reflows <= 6
        assert block.outer_size.height > lines  # room under the text while it streams

        live.settle()
        await pilot.pause()
        assert block.outer_size.height == lines
        await plain.update(" ".join(words))
        plain.display = True
        live.display = False
        await pilot.pause()
        as_plain = screen_lines(app)
        plain.display = False
        live.display = True
        await pilot.pause()
        assert screen_lines(app) == as_plain  # once settled, it looks like Markdown


async def test_the_room_follows_the_stream_rate_and_the_screen() -> None:
    app = Transcript()
    now = 0.0
    async with app.run_test(size=(80, 24)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        live.clock = lambda: now
        app.query_one("#plain", Markdown).display = False
        block: LiveParagraph | None = None

        async def stream(words: int, seconds_per_word: float) -> int:
            nonlocal now, block
            for i in range(words):
                now += seconds_per_word
                await live.append_live(f" word{i:03d}")
                await pilot.pause()
            block = live.query_one(LiveParagraph)
            lines = block.get_content_height(live.size, live.size, block.content_size.width)
            return block.outer_size.height - lines

        # Fast (100 words a second): the room grows, but never past a third of 24 rows.
        room = await stream(200, 0.01)
        assert live._step_lines == 24 // RESERVE_SHARE
        assert 1 <= room <= 24 // RESERVE_SHARE
        # Slow (a word every 2 s, a line in ~16 s): the steps shrink to the smallest.
        await stream(60, 2.0)
        assert live._step_lines == RESERVE_MIN


async def test_a_new_paragraph_takes_over_the_room_so_the_reply_keeps_its_height() -> None:
    app = Transcript()
    async with app.run_test(size=(60, 48)) as pilot:
        live = app.query_one("#live", LiveMarkdown)
        app.query_one("#plain", Markdown).display = False
        for i in range(6):  # a line of text in a first reserve of four
            await live.append_live(f" word{i}")
            await pilot.pause()
        first = live.query_one(LiveParagraph)
        height = live.outer_size.height
        assert height - first.get_content_height(live.size, live.size, 58) >= MIN_SPARE
        await live.append_live("\n\nA second paragraph")
        await pilot.pause()
        await live.append_live(" begins.")
        await pilot.pause()
        assert len(live.query(LiveParagraph)) == 2
        # The transcript below and around does not move: no repaint of all of it.
        assert live.outer_size.height == height
