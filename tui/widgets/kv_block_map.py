"""KvBlockMap: the KV pool's physical blocks, one character each, coloured by owner.

A block is in one of four states, all read from the engine's samples: empty; cached (free,
but still holding a prefix the engine may hand to a later prompt, until it is evicted);
held by a request; or held and reused (the request got it from the prefix cache).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tui import format as fmt

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.style import Style

    from engine.events import BlockCacheState, KvCacheGroup, RequestBlocks, StepSample

REQUEST_COLOURS = 8
LEGEND_REQUESTS = 3
"""Requests named in the legend; the rest are counted on one line (at GPU scale there
are hundreds, and colours repeat after eight anyway)."""
FREE = "·"
USED = "█"
CACHED = "▪"
"""A free block that still holds a cached prefix: evictable, not empty."""
REUSED = "◘"
"""A held block that its request got from the prefix cache instead of computing it."""
# Shades for a cell that stands for several blocks, by the share of them in use.
SHADES = ("░", "▒", "▓")


def drawn_group_note(groups: tuple[KvCacheGroup, ...]) -> str:
    """The legend's line naming the KV cache group drawn; "" for a model with one."""
    if len(groups) < 2:
        return ""
    index, group = next(((i, g) for i, g in enumerate(groups) if g.drawn), (0, groups[0]))
    return f"blocks of group {index + 1}/{len(groups)}: {group.kind}, {group.num_layers} layers"


@dataclass(frozen=True)
class Cell:
    """One character of the map: the blocks it stands for and who holds most of them."""

    first_block: int
    blocks: int
    used: int
    owner: str | None
    cached: int = 0  # free blocks of the cell still holding a cached prefix
    reused: int = 0  # held blocks of the cell that came from the prefix cache

    @property
    def glyph(self) -> str:
        if self.used == 0:
            return CACHED if self.cached else FREE
        if self.used >= self.blocks:
            return REUSED if self.reused * 2 > self.used else USED
        return SHADES[min(2, self.used * 3 // self.blocks)]


def cell_at(
    owners: list[str | None],
    per: int,
    index: int,
    cached: bytearray | None = None,
    reused: bytearray | None = None,
) -> Cell:
    """Cell `index` of a grid where each character stands for `per` blocks; `cached` and
    `reused` flag each block (1) as the engine's block cache state says."""
    first = index * per
    span = owners[first : first + per]
    held = [o for o in span if o is not None]
    owner = Counter(held).most_common(1)[0][0] if held else None
    n_cached = n_reused = 0
    if cached is not None and reused is not None:
        for i, o in enumerate(span, first):
            if o is None:
                n_cached += cached[i]
            else:
                n_reused += reused[i]
    return Cell(first, len(span), len(held), owner, n_cached, n_reused)


def cells_of(
    owners: list[str | None],
    per: int,
    cached: bytearray | None = None,
    reused: bytearray | None = None,
) -> list[Cell]:
    """Every cell of the grid, from the blocks' owners (and their cache flags)."""
    if per == 1:
        if cached is None or reused is None:
            return [Cell(i, 1, o is not None, o) for i, o in enumerate(owners)]
        return [
            Cell(i, 1, 1, o, 0, reused[i]) if o is not None else Cell(i, 1, 0, o, cached[i], 0)
            for i, o in enumerate(owners)
        ]
    return [
        cell_at(owners, per, index, cached, reused) for index in range(math.ceil(len(owners) / per))
    ]


class KvBlockMap(Widget):
    """A grid of the pool's blocks after the latest step, with a legend.

    One character per block while the pool fits in `max_rows` rows; a bigger pool is
    drawn with each character standing for a run of neighbouring blocks (shaded by how
    many are in use), and the legend says how many.
    """

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    KvBlockMap {
        height: auto;
        width: 1fr;
    }
    KvBlockMap > .kv-block-map--free { color: $foreground 30%; }
    KvBlockMap > .kv-block-map--cached { color: $foreground 70%; }
    KvBlockMap > .kv-block-map--legend { color: $foreground-muted; }
    KvBlockMap > .kv-block-map--req-0 { color: $primary; }
    KvBlockMap > .kv-block-map--req-1 { color: $accent; }
    KvBlockMap > .kv-block-map--req-2 { color: $success; }
    KvBlockMap > .kv-block-map--req-3 { color: $secondary; }
    KvBlockMap > .kv-block-map--req-4 { color: $warning; }
    KvBlockMap > .kv-block-map--req-5 { color: $primary-lighten-3; }
    KvBlockMap > .kv-block-map--req-6 { color: $accent-darken-2; }
    KvBlockMap > .kv-block-map--req-7 { color: $success-darken-2; }
    /* Lightened hues fade into a light background: darken them instead. */
    App.-light-mode KvBlockMap > .kv-block-map--req-5 { color: $primary-darken-3; }
    App.-light-mode KvBlockMap > .kv-block-map--free { color: $foreground 40%; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "kv-block-map--free",
        "kv-block-map--cached",
        "kv-block-map--legend",
        *(f"kv-block-map--req-{i}" for i in range(REQUEST_COLOURS)),
    }

    max_rows: reactive[int] = reactive(8, layout=True)
    """Most grid rows to use before several blocks share a character."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.total_blocks = 0
        self.block_size = 0
        self.group_note = ""  # which KV cache group is drawn, when the model has several
        self.requests: tuple[RequestBlocks, ...] = ()
        self._owners: list[str | None] = []
        # What the owners were drawn from, kept so a step costs what it changed: at GPU
        # scale (100,000 blocks, 256 requests) a rebuild per sample was ~50 ms of the loop.
        self._held: dict[str, tuple[int, ...]] = {}
        self._holders: list[int] = []  # how many requests list each block (shared prefixes)
        self._free = 0
        # The engine's prefix-cache flags per block (1: cached if free, reused if held),
        # from the last sample's BlockCacheState; None while the engine does not say.
        self.block_cache: BlockCacheState | None = None
        self._cached = bytearray()
        self._reused = bytearray()
        self._cells: list[Cell] = []
        self._cells_key: tuple[int, int] | None = None  # (blocks per cell, pool) of _cells
        self._dirty_blocks: set[int] | None = None  # changed since _cells; None: all
        self._colours: dict[str, int] = {}
        self.placeholder = "loading…"
        # Bumped on every change of what is shown; render_line rebuilds its rows then.
        self._version = 0
        self._render_key: tuple[object, ...] | None = None
        self._strips: list[Strip] = []

    # -- data ------------------------------------------------------------------------------
    def show_empty_pool(
        self, total_blocks: int, block_size: int, groups: tuple[KvCacheGroup, ...] = ()
    ) -> None:
        """An idle engine's pool, before any step has run; `groups` are the card's."""
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.group_note = drawn_group_note(groups)
        self.requests = ()
        self._rebuild((), total_blocks)
        self._apply_cache(None, total_blocks)
        self._version += 1
        self.refresh(layout=True)

    def show_sample(self, sample: StepSample, finished: Iterable[str] = ()) -> None:
        """Draw `sample`, leaving out requests known to have finished since it was taken."""
        gone = set(finished)
        requests = tuple(r for r in sample.blocks if r.request_id not in gone)
        width = max(1, self.content_size.width)
        height_before = self.get_content_height(Size(0, 0), Size(0, 0), width)
        drawn = self._strips if self._render_key is not None else []
        self.total_blocks = sample.total_blocks
        self.block_size = sample.block_size
        self.requests = requests
        if not self._update(requests, sample.total_blocks):
            self._rebuild(requests, sample.total_blocks)
        self._apply_cache(sample.block_cache, sample.total_blocks)
        self._version += 1
        self._assign_colours(requests)
        # The legend grows and shrinks with the requests: only then is a re-layout needed.
        height_after = self.get_content_height(Size(0, 0), Size(0, 0), width)
        if height_after != height_before or not drawn or not self.size.width:
            self.refresh(layout=height_after != height_before)
            return
        # A step changes a few rows (the blocks a request just took, its legend entry):
        # only those are drawn again, not the whole map and what it overlaps.
        new = self._current_strips()
        width = self.size.width
        rows = range(max(len(drawn), len(new)))
        changed = [
            Region(0, y, width, 1)
            for y in rows
            if y >= len(drawn) or y >= len(new) or drawn[y] != new[y]
        ]
        if changed:
            self.refresh(*changed)

    def _rebuild(self, requests: tuple[RequestBlocks, ...], total: int) -> None:
        """Owners from scratch: a request listed later wins a block two requests share."""
        owners: list[str | None] = [None] * total
        holders = [0] * total
        for req in requests:
            for block in req.block_ids:
                if 0 <= block < total:
                    owners[block] = req.request_id
                    holders[block] += 1
        self._owners, self._holders = owners, holders
        self._free = owners.count(None)
        self._held = {req.request_id: req.block_ids for req in requests}
        self._dirty_blocks = None

    def _update(self, requests: tuple[RequestBlocks, ...], total: int) -> bool:
        """Owners changed by what each request took or gave back since the last sample;
        False when only a rebuild can tell (a new pool, a block two requests share)."""
        if total != len(self._owners):
            return False
        owners, holders = self._owners, self._holders
        dirty: set[int] = set()
        new_held = {req.request_id: req.block_ids for req in requests}

        def release(rid: str, blocks: tuple[int, ...]) -> bool:
            for block in blocks:
                if 0 <= block < total:
                    holders[block] -= 1
                    if holders[block] == 0:
                        owners[block] = None
                        self._free += 1
                        dirty.add(block)
                    elif owners[block] == rid:
                        return False  # still held, by a request not known here
            return True

        for rid, old in self._held.items():
            if rid not in new_held and not release(rid, old):
                return False
        for rid, new in new_held.items():
            old = self._held.get(rid, ())
            if new is old or new == old:
                continue
            if new[: len(old)] == old:
                added = new[len(old) :]
            else:
                if not release(rid, old):
                    return False
                added = new
            for block in added:
                if 0 <= block < total:
                    if holders[block]:
                        return False  # shared: which request shows is the sample's order
                    self._free -= 1
                    holders[block] = 1
                    owners[block] = rid
                    dirty.add(block)
        self._held = new_held
        if self._dirty_blocks is not None:
            self._dirty_blocks |= dirty
        return True

    def _apply_cache(self, state: BlockCacheState | None, total: int) -> None:
        """Take in the engine's cache flags, page by page: an unchanged page (the same
        tuple, or an equal one from a tape) costs one comparison."""
        old = self.block_cache
        self.block_cache = state
        if state is None and old is None and len(self._cached) == total:
            return
        if (
            state is None
            or old is None
            or len(self._cached) != total
            or len(old.cached_pages) != len(state.cached_pages)
            or len(old.reused_pages) != len(state.reused_pages)
        ):
            self._cached, self._reused = bytearray(total), bytearray(total)
            if state is not None:
                for flags, ids in (
                    (self._cached, state.cached_ids()),
                    (self._reused, state.reused_ids()),
                ):
                    for block in ids:
                        if 0 <= block < total:
                            flags[block] = 1
            self._dirty_blocks = None
            return
        dirty: set[int] = set()
        for flags, before, now in (
            (self._cached, old.cached_pages, state.cached_pages),
            (self._reused, old.reused_pages, state.reused_pages),
        ):
            for was, page in zip(before, now, strict=True):
                if page is was or page == was:
                    continue
                for block in was:
                    if 0 <= block < total:
                        flags[block] = 0
                        dirty.add(block)
                for block in page:
                    if 0 <= block < total:
                        flags[block] = 1
                        dirty.add(block)
        if self._dirty_blocks is not None:
            self._dirty_blocks |= dirty

    def _assign_colours(self, requests: tuple[RequestBlocks, ...]) -> None:
        # A request keeps its colour while it lives; colours of finished requests are
        # reused, lowest first, so two live requests never share one while any is free.
        live = {r.request_id for r in requests}
        self._colours = {rid: c for rid, c in self._colours.items() if rid in live}
        for req in requests:
            if req.request_id not in self._colours:
                taken = set(self._colours.values())
                free = [i for i in range(REQUEST_COLOURS) if i not in taken]
                self._colours[req.request_id] = free[0] if free else len(self._colours) % 8

    def owner_of(self, block_id: int) -> str | None:
        """The request holding physical block `block_id`, or None when it is free."""
        return self._owners[block_id] if 0 <= block_id < len(self._owners) else None

    def colour_index(self, request_id: str) -> int | None:
        return self._colours.get(request_id)

    @property
    def free_blocks(self) -> int:
        return self._free

    # -- layout ----------------------------------------------------------------------------
    def blocks_per_cell(self, width: int) -> int:
        capacity = max(1, width) * max(1, self.max_rows)
        return max(1, math.ceil(self.total_blocks / capacity))

    def cells(self, width: int | None = None) -> list[Cell]:
        """The grid's cells, left to right and top to bottom, for a given width."""
        width = width if width is not None else max(1, self.content_size.width)
        per = self.blocks_per_cell(width)
        key = (per, self.total_blocks)
        flags = (self._cached, self._reused) if self.block_cache is not None else (None, None)
        if key != self._cells_key or self._dirty_blocks is None:
            self._cells = cells_of(self._owners, per, *flags)
        else:
            for index in {block // per for block in self._dirty_blocks}:
                self._cells[index] = cell_at(self._owners, per, index, *flags)
        self._cells_key, self._dirty_blocks = key, set()
        return list(self._cells)

    def _legend_entries(self, per_cell: int) -> list[tuple[str, str]]:
        entries: list[tuple[str, str]] = []
        shown = self.requests[:LEGEND_REQUESTS]
        for req in shown:
            colour = self._colours.get(req.request_id, 0)
            label = f"{USED} {req.request_id} {len(req.block_ids)} blk {req.num_tokens:,} tok"
            entries.append((label, f"kv-block-map--req-{colour}"))
        if len(self.requests) > len(shown):
            rest = self.requests[len(shown) :]
            blocks = sum(len(req.block_ids) for req in rest)
            more = f"+{fmt.count(len(rest), 'more request')}, {blocks:,} blk"
            entries.append((more, "kv-block-map--legend"))
        cache = self.block_cache
        if cache is not None and cache.reused:
            entries.append(
                (f"{REUSED} reused {cache.reused:,} (from cache)", "kv-block-map--legend")
            )
        if cache is not None and cache.cached:
            entries.append(
                (f"{CACHED} cached {cache.cached:,} (evictable)", "kv-block-map--cached")
            )
        entries.append(
            (f"{FREE} free {self.free_blocks}/{self.total_blocks}", "kv-block-map--free")
        )
        if per_cell > 1:
            entries.append((f"1 char = {per_cell} blocks", "kv-block-map--legend"))
        elif self.block_size:
            entries.append((f"1 char = 1 block of {self.block_size} tok", "kv-block-map--legend"))
        if self.group_note:
            entries.append((self.group_note, "kv-block-map--legend"))
        return entries

    @staticmethod
    def _pack(entries: list[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
        lines: list[list[tuple[str, str]]] = [[]]
        used = 0
        for label, style in entries:
            need = cell_len(label) + (2 if lines[-1] else 0)
            if lines[-1] and used + need > width:
                lines.append([])
                used = 0
                need = cell_len(label)
            lines[-1].append((label, style))
            used += need
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if not self.total_blocks:
            return 1
        cells = math.ceil(self.total_blocks / self.blocks_per_cell(width))
        grid_rows = math.ceil(cells / max(1, width))
        legend_rows = len(self._pack(self._legend_entries(self.blocks_per_cell(width)), width))
        return grid_rows + legend_rows

    # -- drawing ---------------------------------------------------------------------------
    # A Line API widget: rows are built once per sample as Strips of a few runs each and
    # handed out by render_line. Going through render() and a rich Text instead cost a
    # few milliseconds per frame for a pool of thousands of blocks.
    def _rows(self, width: int) -> list[list[tuple[str, Style]]]:
        """Each line of the map as (text, style) runs: the grid, then the legend."""
        free_style = self.get_component_rich_style("kv-block-map--free")
        cached_style = self.get_component_rich_style("kv-block-map--cached")
        if not self.total_blocks:
            return [[(self.placeholder, free_style)]]
        styles = [
            self.get_component_rich_style(f"kv-block-map--req-{i}") for i in range(REQUEST_COLOURS)
        ]
        rows: list[list[tuple[str, Style]]] = []
        cells = self.cells(width)
        for row_start in range(0, len(cells), width):
            row: list[tuple[str, Style]] = []
            run: list[str] = []
            # A run is one style: one owner's colour, or (no owner) empty or cached.
            run_key: tuple[str | None, bool] = (None, False)
            for cell in cells[row_start : row_start + width]:
                key = (cell.owner, cell.owner is None and cell.cached > 0)
                if run and key != run_key:
                    row.append(
                        ("".join(run), self._run_style(run_key, styles, free_style, cached_style))
                    )
                    run = []
                run_key = key
                run.append(cell.glyph)
            if run:
                row.append(
                    ("".join(run), self._run_style(run_key, styles, free_style, cached_style))
                )
            rows.append(row)
        legend = self.get_component_rich_style("kv-block-map--legend")
        for line in self._pack(self._legend_entries(self.blocks_per_cell(width)), width):
            row = []
            for j, (label, component) in enumerate(line):
                if j:
                    row.append(("  ", legend))
                style = self.get_component_rich_style(component)
                if component.startswith("kv-block-map--req-"):
                    # The swatch carries the colour; the words stay readable.
                    row.append((label[:1], style))
                    row.append((label[1:], legend))
                else:
                    row.append((label, style))
            rows.append(row)
        return rows

    def _run_style(
        self, key: tuple[str | None, bool], styles: list[Style], free: Style, cached: Style
    ) -> Style:
        owner, is_cached = key
        if owner is not None:
            return styles[self._colours.get(owner, 0)]
        return cached if is_cached else free

    def as_text(self, width: int | None = None) -> Text:
        """The map as rich Text (what is drawn, for tests and screenshots of one widget)."""
        width = width if width is not None else max(1, self.content_size.width)
        text = Text(no_wrap=True, overflow="crop", end="")
        for i, row in enumerate(self._rows(width)):
            if i:
                text.append("\n")
            for chunk, style in row:
                text.append(chunk, style)
        return text

    def _current_strips(self) -> list[Strip]:
        width = self.size.width
        base = self.rich_style
        key = (self._version, width, base, self.placeholder)
        if key != self._render_key:
            # Component styles change with the theme: rebuild then too.
            self._strips = [
                Strip([Segment(chunk, base + style) for chunk, style in row])
                .extend_cell_length(width, base)
                .crop(0, width)
                for row in self._rows(max(1, width))
            ]
            self._render_key = key
        return self._strips

    def render_line(self, y: int) -> Strip:
        strips = self._current_strips()
        if y < len(strips):
            return strips[y]
        return Strip.blank(self.size.width, self.rich_style)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._render_key = None  # a theme change: the runs' colours must be looked up again
