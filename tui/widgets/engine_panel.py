"""EnginePanel: the engine, live: step status, KV block map, KV usage, ITL and latency, and
(F8) the roofline."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from engine.errors import KvscopeError
from engine.events import EngineState, ModelCard, StepSample, StepStarted
from tui import figures
from tui import format as fmt
from tui.live_load import LiveLoad, knee
from tui.load_figure import load_figure, load_key
from tui.roofline_figure import (
    NO_PERF_WORDS,
    Roofs,
    machine_roofs,
    remote_no_perf_words,
    roofline_figure,
    roofline_key,
    roofline_title,
)
from tui.telemetry.buffers import KV_WINDOW_S
from tui.telemetry.preemption import preemption_words
from tui.telemetry.request_status import elapsed_words
from tui.widgets.box_titles import retitle
from tui.widgets.fleet_view import FleetView
from tui.widgets.gpu_telemetry_line import GpuTelemetryLine
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.latency_box import LatencyBox
from tui.widgets.plot import Plot
from tui.widgets.remote_state import RemoteStateView
from tui.widgets.request_timeline import LABEL_MAX, short_labels

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.app import ComposeResult

    from engine.features import FleetWatch
    from tui.plotting import PlotRenderer
    from tui.telemetry.buffers import Telemetry
    from tui.telemetry.host_watch import HostWarning

HOST_CHECK_S = 1.0  # the load average moves slowly: reading it once a second is plenty
PLOT_ROWS = 7
"""A plot box's least height with data (engine_panel.tcss): a frame, three rows, an axis."""
EMPTY_PLOT_ROWS = 3
"""A plot box's least height while it shows only its placeholder line."""
PLOT_BOX = "box plot-box -empty"
"""A plot box's classes as composed: empty until its plot has a figure."""
BLOCK_ROWS = 4
"""The block map's rows at every size: at 80x24 a plot still fits on the Engine tab's
first screen, and at 160x48 four plots share what the map leaves (a bigger pool draws
more blocks to a character instead)."""


def step_line(sample: StepSample | None, preemptions_total: int, *, remote: bool = False) -> str:
    """The status line: what the latest sample says, and nothing older."""
    if sample is None:
        return "idle: no step has run yet"
    if remote:
        # A server shows no steps: this is its latest /metrics scrape, and token counts
        # are what its counters grew by since the one before.
        used = sample.total_blocks - sample.free_blocks
        return (
            f"scrape {sample.step:,} · running {sample.running} · waiting {sample.waiting} · "
            f"prompt +{sample.prefill_tokens:,} · generated +{sample.decode_tokens:,} tok · "
            f"KV {sample.kv_usage:.0%} ({used:,}/{fmt.count(sample.total_blocks, 'block')}) · "
            f"preemptions {preemptions_total:,}"
        )
    used = sample.total_blocks - sample.free_blocks
    blocks = f"KV {sample.kv_usage:.0%} ({used:,}/{fmt.count(sample.total_blocks, 'block')})"
    preempted = f"preemptions {preemptions_total:,}"
    if sample.idle or (sample.running == 0 and sample.waiting == 0):
        return f"idle after step {sample.step:,} · running 0 · waiting 0 · {blocks} · {preempted}"
    return (
        f"step {sample.step:,} · running {sample.running} · waiting {sample.waiting} · "
        f"prefill {fmt.count(sample.prefill_tokens, 'tok', 'tok')} · "
        f"decode {fmt.count(sample.decode_tokens, 'tok', 'tok')} · {blocks} · {preempted}"
    )


RUNNING_SHOWN_AFTER_S = 0.3
"""A step that has run this long is shown as running: shorter ones would only flicker."""


def running_line(started: StepStarted, elapsed_s: float) -> str:
    """The status line while a step runs: "step 270 running: prefill 2,048 tok of r7
    (chunk 1 of 2) · 12 s so far"."""
    parts = []
    if len(started.chunks) == 1:
        c = started.chunks[0]
        parts.append(
            f"prefill {fmt.count(c.tokens, 'tok', 'tok')} of {c.request_id} "
            f"(chunk {c.chunk} of {c.chunks})"
        )
    elif started.chunks:
        parts.append(
            f"prefill {fmt.count(started.prefill_tokens, 'tok', 'tok')} of "
            f"{fmt.count(len(started.chunks), 'request')}"
        )
    if started.decoding:
        parts.append(f"decode {fmt.count(started.decoding, 'request')}")
    used = started.total_blocks - started.free_blocks
    return (
        f"step {started.step:,} running: {' + '.join(parts) or 'scheduled'} · "
        f"{elapsed_words(elapsed_s)} so far · KV {used:,}/"
        f"{fmt.count(started.total_blocks, 'block')}"
    )


def running_sample(started: StepStarted, latest: StepSample | None, block_size: int) -> StepSample:
    """The running step as a sample for the block map: the blocks it was just given."""
    total = max(started.total_blocks, 1)
    return StepSample(
        step=started.step,
        started_at=started.started_at,
        duration_s=0.0,
        prefill_tokens=started.prefill_tokens,
        decode_tokens=started.decode_tokens,
        running=len(started.blocks),
        waiting=latest.waiting if latest is not None else 0,
        kv_usage=1.0 - started.free_blocks / total,
        free_blocks=started.free_blocks,
        total_blocks=started.total_blocks,
        block_size=block_size,
        blocks=started.blocks,
        block_cache=started.block_cache,
    )


def _key(*entries: tuple[str, str, str]) -> str:
    """A colour key for a box's border: (theme variable, glyph, words) per entry."""
    return "  ".join(f"[{var}]{glyph}[/] {words}" for var, glyph, words in entries)


class EnginePanel(Vertical):
    """Draws from the telemetry buffers when `redraw()` is called (by a timer)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"engine-panel--warning"}

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Bound from the screen: the panel says "loading" until the engine is ready."""
    card: reactive[ModelCard | None] = reactive(None)
    """The loaded model; gives the empty pool's size before the first step."""
    log_latency: reactive[bool] = reactive(False)
    """The latency plot's y-axis is logarithmic."""
    remote: reactive[bool] = reactive(False)
    """Attached to a server: the block map gives way to what /metrics and KV events show."""
    show_roofline: reactive[bool] = reactive(False)
    """The roofline box is shown (F8): off by default, so the other plots keep their rows."""

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
        # What each part was last drawn from: (data version, plot size) per part.
        self._seen: dict[str, object] = {}
        self._lock = asyncio.Lock()
        self._turn = 0
        self._host: HostWarning | None = None
        self._host_checked = -HOST_CHECK_S
        self.live_load: LiveLoad | None = None
        """The screen's background traffic, whose points the load plot draws."""
        self.fleet: FleetWatch | None = None
        """The replicas behind the router, when attached to a fleet (`--replica`)."""
        self._fleet_read = -HOST_CHECK_S
        # The roofs the roofline draws, for the card they were looked up for: the roofs, or
        # why they are not known; None until looked up (when the box is first shown).
        self._roofs: Roofs | str | None = None
        self._roofs_card: ModelCard | None = None

    def compose(self) -> ComposeResult:
        # Each plot box starts `-empty`, as `_share_rows` finds it at the first tick (no
        # figure yet): set then, it would restyle the box and its plot at every start.
        yield Static("", id="engine-step")
        yield Static("", id="preempt-note")
        with VerticalScroll(id="engine-grid"):
            with Vertical(id="remote-box", classes="box") as box:
                box.border_title = "Server (/metrics, KV events)"
                yield RemoteStateView(id="remote-state")
                yield FleetView(id="fleet-view")
            with Vertical(id="blocks-box", classes="box") as box:
                box.border_title = "KV blocks"
                yield KvBlockMap(id="block-map")
                yield GpuTelemetryLine(id="gpu-telemetry")
            with Vertical(id="kv-box", classes=PLOT_BOX) as box:
                box.border_title = "KV usage"
                yield Plot("no steps yet", id="kv-plot")
            with LatencyBox(self.telemetry, id="itl-box", classes=PLOT_BOX) as box:
                box.border_title = "ITL per output token"
                yield Plot("send a message to see its ITL", id="itl-plot")
            with Vertical(id="ttft-box", classes=PLOT_BOX) as box:
                box.border_title = "Latency vs prompt tokens"
                yield Plot("every reply adds a TTFT and a median-ITL point", id="ttft-plot")
            with Vertical(id="roofline-box", classes=PLOT_BOX) as box:
                box.border_title = "Roofline: FLOP/s vs FLOPs per byte"
                yield Plot(NO_PERF_WORDS, id="roofline-plot")
                yield Static("", id="roofline-check")
            with Vertical(id="load-plot-box", classes=PLOT_BOX) as box:
                box.border_title = "Load: output tok/s vs median ITL"
                yield Plot("each load point lands here", id="load-plot")

    def on_mount(self) -> None:
        self.block_map.max_rows = BLOCK_ROWS
        self.query_one("#preempt-note").display = False
        self._sync_state()
        self.watch_remote(self.remote)
        # Not the watcher: `is_mounted` is still False while on_mount runs.
        self.query_one("#roofline-box").display = self.show_roofline

    def watch_show_roofline(self, shown: bool) -> None:
        if not self.is_mounted:
            return
        self.query_one("#roofline-box").display = shown
        self._seen.pop("roofline", None)

    def _look_up_roofs(self, card: ModelCard | None) -> None:
        """Find the card's roofs once: the fake's at once, a machine's on a thread (a
        file, or NVML), drawn when they arrive."""
        if card is self._roofs_card and self._roofs is not None:
            return
        self._roofs_card = card
        if card is None:
            self._roofs = "no engine loaded yet"
            return
        if card.device == "fake":
            self._roofs = machine_roofs(card)
            return
        self._roofs = "looking up this machine's roofs…"

        async def look_up() -> None:
            try:
                roofs = await asyncio.to_thread(machine_roofs, card)
            except (KvscopeError, OSError) as exc:
                roofs = f"this machine's roofs could not be read: {exc}"
            if card is self._roofs_card:
                self._roofs = roofs
                self._seen.pop("roofline", None)

        self.run_worker(look_up(), group="roofline", exclusive=True, exit_on_error=False)

    def watch_remote(self, remote: bool) -> None:
        if not self.is_mounted:
            return
        # A server never sends physical block IDs: no block map is drawn for it.
        self.query_one("#remote-box").display = remote
        self.query_one("#blocks-box").display = not remote

    @property
    def remote_state(self) -> RemoteStateView:
        return self.query_one(RemoteStateView)

    def watch_engine_state(self) -> None:
        self._sync_state()

    def watch_card(self, card: ModelCard | None) -> None:
        self.telemetry.host.check_load = card is not None and card.device == "cpu"
        if self.is_mounted:
            self.query_one(GpuTelemetryLine).active = card is not None and card.device == "cuda"
        if card is not None and self.telemetry.latest is None:
            self.query_one(KvBlockMap).show_empty_pool(
                card.total_blocks, card.block_size, card.kv_groups
            )

    def watch_log_latency(self) -> None:
        self.invalidate()

    def invalidate(self) -> None:
        """Draw every part again at the next redraw (after a clear or a scale change)."""
        self._seen = {}

    def reset(self) -> None:
        """Show no step yet, as at start-up (a replay rewound, its telemetry emptied)."""
        self.invalidate()
        self._sync_state()
        if self.card is not None and self.telemetry.latest is None:
            card = self.card
            self.block_map.show_empty_pool(card.total_blocks, card.block_size, card.kv_groups)

    def _sync_state(self) -> None:
        if not self.is_mounted:
            return
        state = self.engine_state
        self.set_class(state != "ready", "-not-ready")
        if self.telemetry.latest is None:
            text = fmt.state_words(state, "panel") or step_line(None, 0)
            self.query_one("#engine-step", Static).update(Text(text))
            block_map = self.query_one(KvBlockMap)
            block_map.placeholder = "loading…" if state == "loading" else "–"
            block_map.refresh()
        else:
            self.invalidate()

    @property
    def block_map(self) -> KvBlockMap:
        return self.query_one(KvBlockMap)

    def status_text(self) -> str:
        """The status line as shown (for tests and the demo)."""
        return str(self.query_one("#engine-step", Static).render())

    def _show_preemption(self) -> None:
        note = self.query_one("#preempt-note", Static)
        p = self.telemetry.preemption
        # One re-layout when a preemption happens (and when its cost is known), not per step.
        note.display = p is not None
        note.update(Text(preemption_words(p)) if p is not None else "")

    def preemption_text(self) -> str:
        """The preemption note as shown ("" when there is none), for tests and the demo."""
        note = self.query_one("#preempt-note", Static)
        return str(note.render()) if note.display else ""

    def _preempt_title(self) -> str:
        """The KV box's count of preemptions, and where the last one went once its mark
        has scrolled out of the 60 s window: the mark must not vanish unsaid."""
        tel = self.telemetry
        if not tel.preemptions_total:
            return ""
        words = f" · preempted ×{tel.preemptions_total:,}"
        p, t = tel.preemption, tel.preemption_t
        if p is None or t is None or not tel.kv_t:
            return words
        ago = tel.kv_t[-1] - t
        words += f", last step {p.step:,}"
        if ago > KV_WINDOW_S:
            words += f" ({fmt.duration(ago)} ago, off the plot)"
        return words

    def _share_rows(self) -> None:
        """Say which plot boxes show only their placeholder (`-empty`: they give their
        rows to the others), and whether every plot's least height fits the grid's rows
        under the block map (`-tight` when not: see engine_panel.tcss). Each tick: a class
        that does not change costs nothing."""
        grid = self.query_one("#engine-grid")
        boxes = [box for box in grid.children if box.display]
        need = 0
        flipped = False
        for box in boxes:
            if not box.has_class("plot-box"):
                continue
            plot = box.query_one(Plot)
            empty = not plot.has_figure and plot.display  # hidden: the timeline (F6) shows
            flipped |= box.has_class("-empty") != empty
            box.set_class(empty, "-empty")
            need += EMPTY_PLOT_ROWS if empty else PLOT_ROWS
        fixed = sum(box.outer_size.height for box in boxes if not box.has_class("plot-box"))
        if grid.size.height:
            tight = grid.size.height - fixed < need
            flipped |= self.has_class("-tight") != tight
            self.set_class(tight, "-tight")
        if flipped:
            self.call_after_refresh(self._clamp_scroll)

    def _clamp_scroll(self) -> None:
        """Bring the grid's scroll target back inside it once boxes have shrunk: Textual
        clamps the scroll offset but keeps the target, so the next "up" would aim at a row
        past the end and not move (seen after F6 gave a placeholder back its one row)."""
        grid = self.query_one("#engine-grid")
        if grid.scroll_target_y > grid.max_scroll_y:
            grid.scroll_to(y=grid.max_scroll_y, animate=False, immediate=True)

    def _host_warning(self) -> HostWarning | None:
        now = time.monotonic()
        if now - self._host_checked >= HOST_CHECK_S:
            self._host_checked = now
            self._host = self.telemetry.host.warning()
        return self._host

    def _redraw_roofline(self, changed: Callable[[str, object], bool]) -> Plot:
        """Give the roofline plot its figure and its box its words, when they changed."""
        self._look_up_roofs(self.card)
        plot = self.query_one("#roofline-plot", Plot)
        tel = self.telemetry
        roofs = self._roofs
        # Attached, a point is a scrape window's counter growth, never one step.
        windows = self.remote
        uncounted = tel.uncounted > 0
        # The chat reply whose steps are picked out: the one the ITL plot, the `w` line and
        # the timeline follow (every send makes its reply the one). A window is no step.
        focus = None if windows else tel.itl_request
        key = (tel.perf_version, roofs, windows, uncounted, plot.content_size, focus)
        if changed("roofline", key):
            known = roofs if isinstance(roofs, Roofs) else None
            width, height = plot.content_size
            label = short_labels([focus], LABEL_MAX)[0] if focus is not None else ""
            figure, summary = roofline_figure(
                tel.perf_points, known, width, height, focus=focus, focus_label=label
            )
            placeholder = remote_no_perf_words(uncounted) if windows else NO_PERF_WORDS
            if plot.placeholder != placeholder:
                plot.placeholder = placeholder
                plot.refresh()
            plot.set_figure(figure, (tel.perf_version, roofs, focus))
            why = roofs if isinstance(roofs, str) else ""
            retitle(
                self.query_one("#roofline-box"),
                roofline_title(summary, windows=windows),
                roofline_key(summary, why, windows=windows) if figure is not None else why,
            )
        agreement = tel.perf_agreement
        if changed("roofline-check", (agreement, agreement.version)):
            # vLLM's count against kvscope's: one line under the plot, only where there
            # is something to say (one re-layout when it first appears, none per step).
            words = agreement.words()
            check = self.query_one("#roofline-check", Static)
            check.set_class(agreement.first is not None, "-disagree")
            # A re-layout only when the line's rows change (it appears, or wraps anew).
            width = max(1, check.content_size.width or plot.content_size.width)
            rows = -(-len(words) // width)
            layout = not check.display or rows != self._seen.get("roofline-check-rows")
            self._seen["roofline-check-rows"] = rows
            check.update(Text(words), layout=layout)
            check.display = bool(words)
        return plot

    async def redraw(self, renderer: PlotRenderer, *, wait: bool = True) -> None:
        """Bring the status, block map and plots up to date with the telemetry.

        Cheap when nothing changed: each part compares a version counter first. While a
        draw is still in the plot thread, a timer tick (`wait=False`) is skipped, so draws
        never queue up; `wait=True` waits for it and then draws what is newest.
        """
        if self._lock.locked() and not wait:
            return
        async with self._lock:
            await self._redraw(renderer, wait)

    async def _redraw(self, renderer: PlotRenderer, wait: bool) -> None:
        tel = self.telemetry
        kv_plot = self.query_one("#kv-plot", Plot)
        itl_plot = self.query_one("#itl-plot", Plot)
        ttft_plot = self.query_one("#ttft-plot", Plot)

        def changed(part: str, key: object) -> bool:
            # A figure's ticks depend on its size too: a resize builds it again.
            if self._seen.get(part) == key:
                return False
            self._seen[part] = key
            return True

        steps = tel.steps_version
        running = tel.running
        elapsed = tel.requests.now() - running.started_at if running is not None else 0.0
        shown = running if running is not None and elapsed >= RUNNING_SHOWN_AFTER_S else None
        # A running step ticks its clock: the line is drawn again every tenth of a second.
        steps_changed = changed("steps", (steps, shown and round(elapsed, 1)))
        host = self._host_warning()
        if (steps_changed or changed("host", host)) and (
            tel.latest is not None or shown is not None
        ):
            # The step line has a fixed height (engine_panel.tcss): no re-layout needed.
            line = (
                running_line(shown, elapsed)
                if shown is not None
                else step_line(tel.latest, tel.preemptions_total, remote=self.remote)
            )
            text = Text(line)
            if host is not None:
                text.append("\n")
                text.append(
                    host.words, style=self.get_component_rich_style("engine-panel--warning")
                )
            step = self.query_one("#engine-step", Static)
            step.set_class(host is not None, "-host-busy")
            step.update(text, layout=False)
        if changed("preemption", tel.preemption):
            self._show_preemption()
        if steps_changed and shown is not None and not self.remote:
            size = (
                tel.latest.block_size if tel.latest else (self.card.block_size if self.card else 16)
            )
            self.block_map.show_sample(running_sample(shown, tel.latest, size))
            await asyncio.sleep(0)
        elif steps_changed and tel.latest is not None and not self.remote:
            # Every panel draws the same (latest) sample: no mixing of older state.
            self.block_map.show_sample(tel.latest)
            # Each part of a redraw is a few milliseconds: the loop gets a turn between
            # them (keys, tokens, the frame), so no single stretch blocks it for long.
            await asyncio.sleep(0)
        if changed("kv", (steps, kv_plot.content_size)):
            width, height = kv_plot.content_size
            kv_plot.set_figure(figures.kv_figure(tel, width, height), steps)
            now = f" · now {tel.latest.kv_usage:.0%}" if tel.latest else ""
            preempted = self._preempt_title()
            retitle(
                self.query_one("#kv-box"),
                f"KV usage{now}{preempted}",
                _key(("$primary", "⣿", "used"), ("$error", "│", "preempted")),
            )
        itl = tel.itl_version
        if changed("itl", (itl, itl_plot.content_size)):
            width, height = itl_plot.content_size
            figure, pct = figures.itl_figure(tel, width, height)
            itl_plot.set_figure(figure, (itl, tel.itl_request))
            retitle(
                self.query_one("#itl-box"),
                f"ITL per output token · {tel.itl_request}"
                if tel.itl_request
                else "ITL per output token",
                # The percentiles ride on the key, where each has its colour: the title
                # alone could not hold them at 160x48 ("p90 …").
                _key(
                    ("$primary", "⣿", "ITL"),
                    ("$success", "─", f"p50 {pct.p50:.1f}"),
                    ("$warning", "─", f"p90 {pct.p90:.1f}"),
                    ("$error", "─", f"p99 {pct.p99:.1f} ms"),
                )
                if pct
                else "",
            )
        # After the ITL titles: in timeline mode (F6) the box shows the timeline's.
        self.query_one(LatencyBox).redraw()
        points = tel.points_version
        if changed("points", (points, self.log_latency, ttft_plot.content_size)):
            width, height = ttft_plot.content_size
            figure, summary = figures.latency_figure(tel, width, height, log_y=self.log_latency)
            ttft_plot.set_figure(figure, (points, self.log_latency))
            scale = " · log y" if self.log_latency else ""
            count = f" · {fmt.count(summary.requests, 'request')}" if summary.requests else ""
            entries = [
                ("$primary", figures.TTFT_MARK, "TTFT"),
                ("$accent", figures.ITL_MARK, "median ITL"),
            ]
            if summary.queued:
                words = (
                    "queued (queue time removed)"
                    if summary.queue_removed == summary.queued and not summary.host_busy
                    else "queued"
                )
                entries.append(("$error", figures.QUEUED_MARK, words))
            busy = ""
            if summary.host_busy:
                # Hollow and dim: taken while the host was busy (the status line says why).
                marks = f"{figures.BUSY_TTFT_MARK} {figures.BUSY_ITL_MARK}"
                entries.append(("$foreground-muted", marks, "host busy"))
                busy = f" · {summary.host_busy:,} host busy"
            retitle(
                self.query_one("#ttft-box"),
                f"Latency vs prompt tokens{count}{busy}{scale}",
                _key(*entries) if summary.requests else "",
            )
        fleet_view = self.query_one(FleetView)
        fleet_view.display = self.fleet is not None
        self.query_one("#remote-box").set_class(self.fleet is not None, "-fleet")
        if self.fleet is not None and time.monotonic() - self._fleet_read >= HOST_CHECK_S:
            # The scrapers run on their own threads; their latest rows, once a second.
            self._fleet_read = time.monotonic()
            fleet_view.state = self.fleet.fleet_state()
        plots = [kv_plot, itl_plot, ttft_plot]
        if self.show_roofline:
            plots.append(self._redraw_roofline(changed))
        load = self.live_load
        load_box = self.query_one("#load-plot-box")
        load_box.display = load is not None and bool(load.points)
        if load is not None and load.points:
            load_plot = self.query_one("#load-plot", Plot)
            plots.append(load_plot)
            if changed("load", (load.version, load_plot.content_size)):
                width, height = load_plot.content_size
                figure = load_figure(load, width, height)
                load_plot.set_figure(figure, load.version)
                k = knee(list(load.points))
                retitle(
                    load_box,
                    # The points are labelled on the plot: the title has room for the knee.
                    "Load: out tok/s vs median ITL · "
                    + (
                        f"knee at {fmt.count(k.max_concurrency or 0, 'user')}"
                        if k is not None
                        else fmt.count(len(load.points), "point")
                    ),
                    load_key(figure, load.points, load.ceiling, off_chart=False),
                )
        self._share_rows()
        jobs = [(plot, job) for plot in plots if (job := plot.job())]
        if not jobs:
            return
        if not wait:
            # A timer tick draws one plot, taking turns, so no tick blocks the loop for
            # more than one plot's worth of drawing however much data changed.
            self._turn = (self._turn + 1) % len(plots)
            jobs.sort(key=lambda pj: (plots.index(pj[0]) - self._turn) % len(plots))
            jobs = jobs[:1]
        drawn = await renderer.draw([job for _, job in jobs])
        for (plot, job), ansi in zip(jobs, drawn, strict=True):
            if plot.is_mounted:
                plot.apply(job, ansi)
