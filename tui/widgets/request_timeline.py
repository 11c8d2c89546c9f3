"""RequestTimeline: one row per request, time running right, coloured by what each step did.

The engine panel shows it inside `LatencyBox` (tui/widgets/latency_box.py), in place of
the ITL plot (F6).

Each row is queued (░), prefill chunk (█), decode (━) or preempted (╳) over time, in the
theme's colours. A prefill/decode pair's row (engine/fleet/disaggregated.py) is prefill on
P (█), the KV's hand-off (▒) and decode on D (━), from the client's times: the letters P
and D open the two servers' segments. The ruler on top ticks at every step's start and
points (▼) at the token with the selected reply's worst ITL. Time runs over a window that
fits the visible rows; idle stretches between them (the user reading, say) are cut to one
column (┊), so a chat session with long pauses still shows its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tui import format as fmt
from tui.telemetry.timeline import SegmentKind, TimelineRow, iter_window

if TYPE_CHECKING:
    from tui.telemetry.buffers import Telemetry

GLYPHS: dict[SegmentKind, str] = {
    "queued": "░",
    "prefill": "█",
    "decode": "━",
    "preempted": "╳",
    "handoff": "▒",
}
# When one column covers several kinds, the rarer and costlier one shows: a single
# prefill chunk or preemption must not vanish into a column of decode steps.
PRIORITY: dict[SegmentKind, int] = {
    "decode": 1,
    "queued": 2,
    "handoff": 3,
    "prefill": 4,
    "preempted": 5,
}
GAP = "┊"
RULE = "─"
TICK = "┬"
WORST = "▼"
CURSOR = "▽"
CUT_SHARE = 0.1
"""An idle stretch longer than this share of the window is cut to one column."""
LABEL_MAX = 8

# One space between entries: at 160 columns the engine's boxes are under 60 wide.
KEY = " ".join(
    f"[{var}]{glyph}[/] {words}"
    for var, glyph, words in (
        ("$foreground-muted", GLYPHS["queued"], "queued"),
        ("$accent", GLYPHS["prefill"], "prefill"),
        ("$primary", GLYPHS["decode"], "decode"),
        ("$error", GLYPHS["preempted"], "preempted"),
        ("$error", WORST, "worst ITL"),
    )
)
"""The timeline's colour key, for its box's border (theme variables, no hex codes)."""


# -- time to columns --------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """A stretch of time drawn at the common scale, from column `first` on."""

    start: float
    end: float
    first: int
    cols: int


@dataclass(frozen=True)
class TimeScale:
    """Engine time to columns: busy pieces at one scale, a cut column between two."""

    pieces: tuple[Piece, ...]
    cuts: tuple[int, ...]  # the column of each cut idle stretch, between piece i and i+1
    width: int
    seconds_per_col: float

    @property
    def start(self) -> float:
        return self.pieces[0].start

    @property
    def end(self) -> float:
        return self.pieces[-1].end

    def column(self, t: float) -> int:
        for i, p in enumerate(self.pieces):
            if t < p.start:
                return self.cuts[i - 1] if i > 0 else p.first
            if t <= p.end:
                span = p.end - p.start
                frac = (t - p.start) / span if span > 0 else 0.0
                return p.first + min(p.cols - 1, int(frac * p.cols))
        last = self.pieces[-1]
        return last.first + last.cols - 1


def build_scale(spans: list[tuple[float, float]], width: int) -> TimeScale | None:
    """A scale that fits `spans` (start, end) into `width` columns, idle stretches cut."""
    if not spans or width < 1:
        return None
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, max(a, b)])
    total = merged[-1][1] - merged[0][0]
    pieces: list[list[float]] = [merged[0]]
    for a, b in merged[1:]:
        if a - pieces[-1][1] > CUT_SHARE * total:
            pieces.append([a, b])
        else:
            pieces[-1][1] = b
    if len(pieces) * 2 - 1 > width:
        pieces = [[merged[0][0], merged[-1][1]]]  # no room to cut: one piece
    cuts_n = len(pieces) - 1
    avail = width - cuts_n
    spans_s = [b - a for a, b in pieces]
    busy = sum(spans_s)
    # Columns in proportion to time, at least one each (largest remainders get the rest).
    if busy <= 0:
        shares = [avail / len(pieces)] * len(pieces)
    else:
        shares = [avail * s / busy for s in spans_s]
    cols = [max(1, math.floor(x)) for x in shares]
    order = sorted(
        range(len(pieces)), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True
    )
    k = 0
    while sum(cols) < avail:
        cols[order[k % len(order)]] += 1
        k += 1
    while sum(cols) > avail:
        i = max(range(len(cols)), key=lambda j: cols[j])
        cols[i] -= 1
    out: list[Piece] = []
    cuts: list[int] = []
    col = 0
    for i, ((a, b), n) in enumerate(zip(pieces, cols, strict=True)):
        if i:
            cuts.append(col)
            col += 1
        out.append(Piece(a, b, col, n))
        col += n
    return TimeScale(tuple(out), tuple(cuts), width, busy / avail if busy > 0 else 0.0)


# -- the layout -------------------------------------------------------------------------------
Run = tuple[str, str]
"""Text and the component classes (space-separated) that style it."""


@dataclass(frozen=True)
class TimelineLayout:
    """What the timeline shows at one size: lines of styled runs, and its title."""

    lines: tuple[tuple[Run, ...], ...]
    title: str
    rows: tuple[str, ...]  # the request IDs shown, top to bottom
    offset: int  # rows scrolled back from the newest (clamped)
    scale: TimeScale | None = None

    def plain(self) -> str:
        return "\n".join("".join(text for text, _ in line) for line in self.lines)


def _runs(cells: list[tuple[str, str]]) -> tuple[Run, ...]:
    out: list[Run] = []
    for glyph, comp in cells:
        if out and out[-1][1] == comp:
            out[-1] = (out[-1][0] + glyph, comp)
        else:
            out.append((glyph, comp))
    return tuple(out)


def _c(name: str) -> str:
    return f"request-timeline--{name}"


def _row_end(row: TimelineRow, latest: float | None) -> float:
    if row.end is not None:
        return row.end
    return max(row.cursor, latest if latest is not None else row.cursor)


def _token_time(tel: Telemetry, index: int) -> float | None:
    """When token `index` of the tracked reply was made: the middle of its step."""
    if not 0 <= index < len(tel.tokens):
        return None
    mark = tel.tokens[index]
    record = tel.timeline.step(mark.step)
    if record is not None:
        return (record.start + record.end) / 2
    return mark.time_s


SEPARATORS = "-._:"
"""Where an ID's parts meet: a cut label starts at one, so it reads "…-1-61", not "…5-1-61"."""


def short_labels(ids: list[str], width: int) -> list[str]:
    """Each ID in at most `width` cells: whole if it fits, else "…" and its end.

    Load requests are named "load-<seed>-<point>-<n>": cut to their start, every row read
    "load-12…". Their distinct part is the end, so that is what is kept, from a separator
    on where the labels stay apart ("…-1-8", "…-1-61"), else as many end cells as fit.
    """
    keep = max(1, width - 1)  # the cells after "…"
    tails = [i if len(i) <= width else i[-keep:] for i in ids]
    neat = []
    for rid, tail in zip(ids, tails, strict=True):
        if len(rid) <= width:
            neat.append(rid)
            continue
        cut = next((k for k, ch in enumerate(tail) if ch in SEPARATORS), None)
        neat.append(tail[cut:] if cut is not None and cut < len(tail) - 1 else tail)
    # Cut at separators only if that keeps every label apart (IDs that differ early on).
    chosen = neat if len(set(neat)) == len(set(ids)) else tails
    return [c if c == rid else "…" + c for rid, c in zip(ids, chosen, strict=True)]


def lay_out(
    tel: Telemetry, width: int, height: int, offset: int = 0, *, keep: str | None = None
) -> TimelineLayout:
    """The timeline of `tel` at `width` x `height` cells, `offset` rows back from the newest.

    `keep` names a request whose row must be in view (the one the `w` line explains):
    the offset moves the least that shows it.

    A pure function of the telemetry, so a test can read the picture without drawing it.
    """
    timeline = tel.timeline

    def note(words: str) -> TimelineLayout:
        return TimelineLayout((((words, _c("placeholder")),),), "Timeline", (), 0)

    all_rows = list(timeline.rows)
    if timeline.per_request is False:
        # A remote server shows no steps; a prefill/decode pair's finished requests still
        # get their rows, from the client's times of each half.
        all_rows = [r for r in all_rows if r.servers is not None]
        if not all_rows:
            return note("a remote server does not show its steps: no timeline")
    if not all_rows:
        return note("each request gets a row here: send a message")
    n = max(1, height - 1)  # the ruler takes the top line
    offset = max(0, min(offset, len(all_rows) - n))
    at = next((k for k, r in enumerate(all_rows) if r.request_id == keep), None)
    if at is not None:
        # In view when stop - n <= at < stop, with stop = len - offset.
        offset = max(len(all_rows) - at - n, min(offset, len(all_rows) - at - 1))
        offset = max(0, min(offset, len(all_rows) - n))
    stop = len(all_rows) - offset
    visible = all_rows[max(0, stop - n) : stop]
    label_w = min(LABEL_MAX, max(len(r.request_id) for r in visible)) + 1
    labels = short_labels([r.request_id for r in visible], label_w - 1)
    bar_w = width - label_w
    if bar_w < 4:
        return note("too narrow for the timeline")
    latest = timeline.latest_end
    spans = [(r.submitted, _row_end(r, latest)) for r in visible]
    scale = build_scale(spans, bar_w)
    assert scale is not None
    # The ruler: a tick where a step starts, the worst-ITL token and the cursor marked.
    ruler = [(RULE, _c("ruler")) for _ in range(bar_w)]
    first_step: int | None = None
    last_step: int | None = None
    for record in iter_window(timeline.steps, scale.start, scale.end):
        if record.start < scale.start:
            continue
        first_step = record.step if first_step is None else first_step
        last_step = record.step
        ruler[scale.column(record.start)] = (TICK, _c("ruler"))
    for c in scale.cuts:
        ruler[c] = (GAP, _c("gap"))
    tracked = tel.itl_request
    tracked_visible = any(r.request_id == tracked for r in visible)
    cursor_col: int | None = None
    if tracked_visible:
        worst = tel.worst_token()
        worst_t = _token_time(tel, worst) if worst is not None else None
        if worst_t is not None and scale.start <= worst_t <= scale.end:
            ruler[scale.column(worst_t)] = (WORST, _c("worst"))
        cursor_t = _token_time(tel, tel.cursor) if tel.cursor is not None else None
        if cursor_t is not None and scale.start <= cursor_t <= scale.end:
            cursor_col = scale.column(cursor_t)
            if ruler[cursor_col][0] != WORST:
                ruler[cursor_col] = (CURSOR, _c("cursor-mark"))
    label = "step" if label_w > 4 else ""
    lines: list[tuple[Run, ...]] = [
        ((label.ljust(label_w), _c("label")), *_runs(ruler)),
    ]
    for row, name in zip(visible, labels, strict=True):
        cells: list[tuple[str, str]] = [(" ", _c("empty")) for _ in range(bar_w)]
        best = [0] * bar_w
        for seg in row.segments:
            if seg.end < scale.start or seg.start > scale.end:
                continue
            c0 = scale.column(seg.start)
            c1 = max(c0, scale.column(max(seg.start, seg.end - 1e-9)))
            rank = PRIORITY[seg.kind]
            for c in range(c0, c1 + 1):
                if rank > best[c]:
                    best[c] = rank
                    cells[c] = (GLYPHS[seg.kind], _c(seg.kind))
        if row.servers is not None:
            _mark_servers(row, scale, cells)
        for c in scale.cuts:
            cells[c] = (GAP, _c("gap"))
        mine = row.request_id == tracked
        if mine and cursor_col is not None:
            glyph, comp = cells[cursor_col]
            cells[cursor_col] = (glyph, f"{comp} {_c('cursor')}")
        lines.append(((name.ljust(label_w), _c("tracked" if mine else "label")), *_runs(cells)))
    parts = ["Timeline"]
    shown = len(visible)
    if shown < len(all_rows):
        top = len(all_rows) - offset - shown + 1
        parts.append(f"requests {top:,}–{top + shown - 1:,} of {len(all_rows):,} (↑↓)")
    else:
        parts.append(fmt.count(shown, "request"))
    if first_step is not None and last_step is not None:
        parts.append(
            f"step {first_step:,}"
            if first_step == last_step
            else f"steps {first_step:,}–{last_step:,}"
        )
    if scale.seconds_per_col > 0:
        # Short: the whole title must fit the box at 160x48 (about 55 cells).
        per_col = scale.seconds_per_col
        parts.append(f"{per_col:.1f} s/col" if per_col >= 1 else f"{fmt.ms(per_col)}/col")
    if scale.cuts:
        parts.append(f"{GAP} idle")
    pairs = {r.servers for r in visible if r.servers is not None}
    if len(pairs) == 1:
        ((p, d),) = pairs
        parts.append(f"P={p} {GLYPHS['handoff']}=KV D={d}")
    return TimelineLayout(
        tuple(lines), " · ".join(parts), tuple(r.request_id for r in visible), offset, scale
    )


def _mark_servers(row: TimelineRow, scale: TimeScale, cells: list[tuple[str, str]]) -> None:
    """P at the start of a pair's prefill segment, D at its decode's: which server ran what.
    Only on a segment two columns wide or more, so the letter never hides the only cell."""
    for letter, kind in (("P", "prefill"), ("D", "decode")):
        seg = next((s for s in row.segments if s.kind == kind), None)
        if seg is None or seg.end < scale.start or seg.start > scale.end:
            continue
        c0 = scale.column(seg.start)
        c1 = scale.column(max(seg.start, seg.end - 1e-9))
        # Its first column may be the neighbour's (the costlier kind wins a shared one).
        first = next((c for c in range(c0, c1) if cells[c][1] == cells[c + 1][1] == _c(kind)), None)
        if first is not None:
            cells[first] = (letter, _c(kind))


# -- the widgets ------------------------------------------------------------------------------
COMPONENTS = (
    "queued",
    "prefill",
    "decode",
    "preempted",
    "handoff",
    "gap",
    "ruler",
    "worst",
    "cursor",
    "cursor-mark",
    "label",
    "tracked",
    "empty",
    "placeholder",
)


class RequestTimeline(Widget):
    """The timeline of a `Telemetry`, drawn with the Line API.

    Lines are laid out once per change of the telemetry's timeline (its version), the
    cursor, the scroll offset, the size or the theme, then handed out by `render_line`.
    """

    DEFAULT_CSS = """
    RequestTimeline { height: 1fr; width: 1fr; }
    RequestTimeline > .request-timeline--queued { color: $foreground-muted; }
    RequestTimeline > .request-timeline--prefill { color: $accent; }
    RequestTimeline > .request-timeline--decode { color: $primary; }
    RequestTimeline > .request-timeline--preempted { color: $error; text-style: bold; }
    RequestTimeline > .request-timeline--handoff { color: $warning; }
    RequestTimeline > .request-timeline--gap { color: $foreground 30%; }
    RequestTimeline > .request-timeline--ruler { color: $foreground-muted; }
    RequestTimeline > .request-timeline--worst { color: $error; text-style: bold; }
    RequestTimeline > .request-timeline--cursor { text-style: reverse; }
    RequestTimeline > .request-timeline--cursor-mark { color: $accent; text-style: bold; }
    RequestTimeline > .request-timeline--label { color: $foreground-muted; }
    RequestTimeline > .request-timeline--tracked { color: $accent; text-style: bold; }
    RequestTimeline > .request-timeline--empty { }
    RequestTimeline > .request-timeline--placeholder { color: $foreground-muted; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {_c(name) for name in COMPONENTS}

    scroll_back: reactive[int] = reactive(0)
    """Rows scrolled back from the newest request (0: the newest is the bottom row)."""
    follow: reactive[str | None] = reactive(None)
    """A request whose row is kept in view (the one the `w` line explains), as new rows
    come in; None once the user scrolls on (↑↓)."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.telemetry = telemetry
        self._layout_key: tuple[object, ...] | None = None
        self._layout: TimelineLayout | None = None
        self._strip_key: tuple[object, ...] | None = None
        self._strips: list[Strip] = []

    def _key(self) -> tuple[object, ...]:
        tel = self.telemetry
        return (
            tel.timeline.version,
            tel.cursor,
            tel.itl_request,
            self.scroll_back,
            self.follow,
            self.size.width,
            self.size.height,
        )

    def layout_now(self) -> TimelineLayout:
        """The layout for the current data and size (computed again only after a change)."""
        key = self._key()
        if key != self._layout_key or self._layout is None:
            layout = lay_out(
                self.telemetry,
                self.size.width,
                self.size.height,
                self.scroll_back,
                keep=self.follow,
            )
            self._layout = layout
            self._layout_key = key
            if layout.offset != self.scroll_back:
                # Clamped to the rows there are: scrolling past the oldest stops there.
                self.set_reactive(RequestTimeline.scroll_back, layout.offset)
        return self._layout

    def changed(self) -> bool:
        """Whether the next draw would differ from the last one."""
        return self._key() != self._layout_key

    def watch_scroll_back(self) -> None:
        self.refresh()

    def watch_follow(self) -> None:
        self.refresh()

    def as_text(self) -> Text:
        """What is drawn, as rich Text (for tests)."""
        text = Text(no_wrap=True, overflow="crop", end="")
        for i, line in enumerate(self.layout_now().lines):
            if i:
                text.append("\n")
            for chunk, comps in line:
                text.append(chunk, self._style(comps))
        return text

    def _style(self, comps: str) -> Style:
        style = Style()
        for comp in comps.split():
            style += self.get_component_rich_style(comp)
        return style

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        layout = self.layout_now()
        key = (self._layout_key, base)
        if key != self._strip_key:
            self._strips = [
                Strip([Segment(chunk, base + self._style(comps)) for chunk, comps in line])
                .extend_cell_length(width, base)
                .crop(0, width)
                for line in layout.lines
            ]
            self._strip_key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip_key = None  # a theme change: look the colours up again
