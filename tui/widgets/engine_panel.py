"""EnginePanel: the engine, live: step status, KV block map, KV usage, ITL and latency."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from engine.events import EngineState, ModelCard, StepSample
from tui import figures
from tui import format as fmt
from tui.widgets.box_titles import retitle
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.plot import Plot
from tui.widgets.remote_state import RemoteStateView
from tui.widgets.request_timeline import LatencyBox

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from tui.host_watch import HostWarning
    from tui.plotting import PlotRenderer
    from tui.telemetry import Telemetry

HOST_CHECK_S = 1.0  # the load average moves slowly: reading it once a second is plenty


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


def _key(*entries: tuple[str, str, str]) -> str:
    """A colour key for a box's border: (theme variable, glyph, words) per entry."""
    return "  ".join(f"[{var}]{glyph}[/] {words}" for var, glyph, words in entries)


ITL_KEY = _key(
    ("$primary", "⣿", "ITL"),
    ("$success", "─", "p50"),
    ("$warning", "─", "p90"),
    ("$error", "─", "p99"),
)


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

    def compose(self) -> ComposeResult:
        yield Static("", id="engine-step")
        with VerticalScroll(id="engine-grid"):
            with Vertical(id="remote-box", classes="box") as box:
                box.border_title = "Server (/metrics, KV events)"
                yield RemoteStateView(id="remote-state")
            with Vertical(id="blocks-box", classes="box") as box:
                box.border_title = "KV blocks"
                yield KvBlockMap(id="block-map")
            with Vertical(id="kv-box", classes="box plot-box") as box:
                box.border_title = "KV usage % · last 60 s"
                yield Plot("no steps yet", id="kv-plot")
            with LatencyBox(self.telemetry, id="itl-box", classes="box plot-box") as box:
                box.border_title = "ITL per output token"
                yield Plot("send a message to see its ITL", id="itl-plot")
            with Vertical(id="ttft-box", classes="box plot-box") as box:
                box.border_title = "Latency vs prompt tokens"
                yield Plot("every reply adds a TTFT and a median-ITL point", id="ttft-plot")

    def on_mount(self) -> None:
        self._sync_state()
        self.watch_remote(self.remote)

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

    def _host_warning(self) -> HostWarning | None:
        now = time.monotonic()
        if now - self._host_checked >= HOST_CHECK_S:
            self._host_checked = now
            self._host = self.telemetry.host.warning()
        return self._host

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
        steps_changed = changed("steps", steps)
        host = self._host_warning()
        if (steps_changed or changed("host", host)) and tel.latest is not None:
            # The step line has a fixed height (engine_panel.tcss): no re-layout needed.
            line = step_line(tel.latest, tel.preemptions_total, remote=self.remote)
            text = Text(line)
            if host is not None:
                text.append("\n")
                text.append(
                    host.words, style=self.get_component_rich_style("engine-panel--warning")
                )
            step = self.query_one("#engine-step", Static)
            step.set_class(host is not None, "-host-busy")
            step.update(text, layout=False)
        if steps_changed and tel.latest is not None and not self.remote:
            # Every panel draws the same (latest) sample: no mixing of older state.
            self.block_map.show_sample(tel.latest)
            # Each part of a redraw is a few milliseconds: the loop gets a turn between
            # them (keys, tokens, the frame), so no single stretch blocks it for long.
            await asyncio.sleep(0)
        if changed("kv", (steps, kv_plot.content_size)):
            width, height = kv_plot.content_size
            kv_plot.set_figure(figures.kv_figure(tel, width, height), steps)
            now = f" · now {tel.latest.kv_usage:.0%}" if tel.latest else ""
            preempted = f" · preemptions {tel.preemptions_total}" if tel.preemptions_total else ""
            retitle(
                self.query_one("#kv-box"),
                f"KV usage % · last 60 s{now}{preempted}",
                _key(("$primary", "⣿", "used"), ("$error", "│", "preempted")),
            )
        itl = tel.itl_version
        if changed("itl", (itl, itl_plot.content_size)):
            width, height = itl_plot.content_size
            figure, pct = figures.itl_figure(tel, width, height)
            itl_plot.set_figure(figure, (itl, tel.itl_request))
            retitle(
                self.query_one("#itl-box"),
                f"ITL per output token · {tel.itl_request}" + (f" · {pct.caption()}" if pct else "")
                if tel.itl_request
                else "ITL per output token",
                ITL_KEY if pct else "",
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
                    if summary.queue_removed == summary.queued
                    else "queued"
                )
                entries.append(("$error", figures.QUEUED_MARK, words))
            retitle(
                self.query_one("#ttft-box"),
                f"Latency vs prompt tokens{count}{scale}",
                _key(*entries) if summary.requests else "",
            )
        plots = [kv_plot, itl_plot, ttft_plot]
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
