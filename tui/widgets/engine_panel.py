"""EnginePanel: the engine, live: step status, KV block map, KV usage, ITL and TTFT."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.reactive import reactive
from textual.widgets import Static

from engine.events import EngineState, ModelCard, StepSample
from tui import figures
from tui import format as fmt
from tui.plotting import PlotRenderer
from tui.telemetry import Telemetry
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.plot import Plot


def step_line(sample: StepSample | None, preemptions_total: int) -> str:
    if sample is None:
        return "idle: no step has run yet"
    used = sample.total_blocks - sample.free_blocks
    return (
        f"last step {sample.step:,} · running {sample.running} · waiting {sample.waiting} · "
        f"prefill {sample.prefill_tokens:,} tok · decode {sample.decode_tokens:,} tok · "
        f"KV {sample.kv_usage:.0%} ({used:,}/{sample.total_blocks:,} blocks) · "
        f"preemptions {preemptions_total:,}"
    )


class EnginePanel(Vertical):
    """Draws from the telemetry buffers when `redraw()` is called (by a timer)."""

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Bound from the screen: the panel says "loading" until the engine is ready."""
    card: reactive[ModelCard | None] = reactive(None)
    """The loaded model; gives the empty pool's size before the first step."""

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
        self._seen: tuple[int, int, int] = (-1, -1, -1)
        self._lock = asyncio.Lock()
        self._turn = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="engine-step")
        with Grid(id="engine-grid"):
            with Vertical(id="blocks-box", classes="box") as box:
                box.border_title = "KV blocks"
                yield KvBlockMap(id="block-map")
            with Vertical(id="kv-box", classes="box") as box:
                box.border_title = "KV usage %"
                yield Plot("no steps yet", id="kv-plot")
            with Vertical(id="itl-box", classes="box") as box:
                box.border_title = "ITL per token (ms)"
                yield Plot("send a message to see its ITL", id="itl-plot")
            with Vertical(id="ttft-box", classes="box") as box:
                box.border_title = "TTFT (ms) vs prompt tokens"
                yield Plot("every reply adds a point", id="ttft-plot")

    def on_mount(self) -> None:
        self._sync_state()

    def watch_engine_state(self) -> None:
        self._sync_state()

    def watch_card(self, card: ModelCard | None) -> None:
        if card is not None and self.telemetry.latest is None:
            self.query_one(KvBlockMap).show_empty_pool(card.total_blocks, card.block_size)

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
            self._seen = (-1, -1, -1)  # redraw everything at the next tick

    @property
    def block_map(self) -> KvBlockMap:
        return self.query_one(KvBlockMap)

    def plots(self) -> list[Plot]:
        return list(self.query(Plot))

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
        steps, itl, ttft = tel.steps_version, tel.itl_version, tel.ttft_version
        seen_steps, seen_itl, seen_ttft = self._seen
        self._seen = (steps, itl, ttft)
        if steps != seen_steps and tel.latest is not None:
            # The step line has a fixed height (engine_panel.tcss): no re-layout needed.
            self.query_one("#engine-step", Static).update(
                Text(step_line(tel.latest, tel.preemptions_total)), layout=False
            )
            self.block_map.show_sample(tel.latest, tel.finished)
        kv_plot = self.query_one("#kv-plot", Plot)
        itl_plot = self.query_one("#itl-plot", Plot)
        ttft_plot = self.query_one("#ttft-plot", Plot)
        if steps != seen_steps:
            kv_plot.set_figure(figures.kv_figure(tel, kv_plot.content_size.width), steps)
            now = f" · now {tel.latest.kv_usage:.0%}" if tel.latest else ""
            self.query_one("#kv-box").border_title = (
                f"KV usage %{now} · preemptions {tel.preemptions_total}"
                if tel.preemptions_total
                else f"KV usage %{now}"
            )
        if itl != seen_itl:
            figure, pct = figures.itl_figure(tel, itl_plot.content_size.width)
            itl_plot.set_figure(figure, (itl, tel.itl_request))
            title = f"ITL per token · {tel.itl_request}" if tel.itl_request else "ITL per token"
            box = self.query_one("#itl-box")
            box.border_title = title
            box.border_subtitle = pct.caption() if pct else ""
        if ttft != seen_ttft:
            ttft_plot.set_figure(figures.ttft_figure(tel), ttft)
            self.query_one("#ttft-box").border_subtitle = (
                f"{len(tel.ttft_points)} requests" if tel.ttft_points else ""
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
