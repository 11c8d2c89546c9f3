"""What a frame repaints: border titles and the block map's rows (a streaming reply's text:
test_tui_live_markdown.py).

These widgets exist to keep frames small under a fast stream (benchmarks/ui_lag.py). Each
test checks both halves: the screen shows the new state, and no more than the changed
part was drawn again or laid out.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from tui_helpers import block_sample, screen_lines, wait_until

from engine.events import RequestBlocks
from tui.widgets.box_titles import retitle
from tui.widgets.kv_block_map import LEGEND_REQUESTS, KvBlockMap, cells_of

if TYPE_CHECKING:
    from textual.widget import Widget


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


def owners_from_scratch(blocks: tuple[RequestBlocks, ...], total: int) -> list[str | None]:
    owners: list[str | None] = [None] * total
    for req in blocks:
        for block in req.block_ids:
            owners[block] = req.request_id
    return owners


async def test_block_map_repaints_changed_rows_and_the_screen_matches_a_full_draw() -> None:
    block_map = KvBlockMap()
    rng = random.Random(7)
    async with MapApp(block_map).run_test(size=(30, 20)) as pilot:
        for total in (200, 1_000):  # one character a block, then several
            held: dict[str, list[int]] = {"a": [0, 1], "b": [2]}
            free = list(range(3, total))
            for _ in range(40):
                # Requests grow by a block or two, sometimes one ends and another starts,
                # sometimes sharing the first blocks of another (a cached prefix).
                for ids in held.values():
                    for _ in range(rng.randint(0, 2)):
                        if free:
                            ids.append(free.pop(rng.randrange(len(free))))
                if rng.random() < 0.2:
                    gone = rng.choice(sorted(held))
                    released = held.pop(gone)
                    still = {b for ids in held.values() for b in ids}
                    free.extend(b for b in released if b not in still)
                    held[f"r{rng.randint(0, 999)}"] = [free.pop(0)]
                if rng.random() < 0.2 and 0 < len(held) < 5:
                    source = held[rng.choice(sorted(held))]
                    held[f"s{rng.randint(0, 999)}"] = source[: rng.randint(1, len(source))]
                blocks = tuple(
                    RequestBlocks(rid, tuple(ids), 16 * len(ids))
                    for rid, ids in sorted(held.items())
                )
                block_map.show_sample(block_sample(blocks, total))
                await pilot.pause()
                shown = screen_lines(block_map.app, block_map.size.height)
                expected = block_map.as_text().plain.splitlines()
                assert [line.rstrip() for line in shown] == [line.rstrip() for line in expected]
                # What a step updated in place is what a rebuild from the sample gives.
                owners = owners_from_scratch(blocks, total)
                per = block_map.blocks_per_cell(30)
                assert block_map.cells(30) == cells_of(owners, per)
                assert block_map.free_blocks == owners.count(None)


async def test_block_map_step_marks_only_the_rows_that_changed() -> None:
    block_map = KvBlockMap()
    async with MapApp(block_map).run_test(size=(30, 20)) as pilot:
        first = (RequestBlocks("a", (0, 1), 32),)
        block_map.show_sample(block_sample(first, 120))
        # Until the first sample is on screen: what it marked (every row) has been painted,
        # so what is marked next is the second step's alone. A pause is not that: on a
        # loaded host the screen's update can come after it.
        await wait_until(pilot, lambda: not block_map._repaint_regions, 10, "the first paint")
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


async def test_block_map_names_the_first_requests_and_counts_the_rest() -> None:
    block_map = KvBlockMap()
    async with MapApp(block_map).run_test(size=(60, 30)) as pilot:
        blocks = tuple(
            RequestBlocks(f"r{i}", tuple(range(4 * i, 4 * i + 4)), 64) for i in range(300)
        )
        block_map.show_sample(block_sample(blocks, 100_000))
        await pilot.pause()
        text = block_map.as_text().plain
        last = LEGEND_REQUESTS - 1
        assert f"█ r{last} 4 blk" in text
        assert f"r{last + 1} " not in text
        rest = 300 - LEGEND_REQUESTS
        assert f"+{rest} more requests, {4 * rest:,} blk" in text
        assert "free 98800/100000" in text
        assert block_map.outer_size.height < 30  # the legend does not take the screen
