"""LoadPane: the sweep screen's load mode (F4). Its form (the load levels, prompt and output
tokens, requests a level, warm-up), the run it measures with `bench.load_runner.run_load`
(the runner behind `kvscope bench --concurrency 1,2,4,8`), a saved load run to compare
with, and the results widget it fills.

The pane sits in the screen's form column; its results (`LoadSweepResults`) sit in the
results column, so the screen composes both and hands the results to the pane. The screen
keeps what both modes share: F6, the worker, the progress bar and the status line. The
pane gives it the words and the progress to show there."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label, Static

from bench.load_result import LoadResult
from bench.load_runner import run_load
from bench.sweep_result import fresh_seed
from tui import format as fmt
from tui.live_load import load_ceiling
from tui.sweep.load_view_model import LoadForm, LoadProgress, done_words, read_load_form
from tui.sweep.overlay import LoadOverlay

if TYPE_CHECKING:
    from pathlib import Path

    from textual.app import ComposeResult

    from bench.load_result import LoadPoint
    from bench.load_runner import Ceiling, LoadTick
    from bench.sweep_files import SavedLoad
    from engine.events import ModelCard
    from engine.protocol import Engine
    from tui.plotting import PlotRenderer
    from tui.sweep.load_results import LoadSweepResults

LOAD_FIELDS = (
    ("load levels", "load-levels", "levels"),
    ("prompt tokens", "load-prompt-len", "prompt_len"),
    ("output tokens", "load-output-len", "output_len"),
    ("requests/level", "load-requests", "requests"),
    ("warm-up", "load-warmup", "warmup"),
)
"""(label, input id, LoadForm field) of the load mode's form."""


class LoadPane(Vertical):
    """The load mode's form, and the load sweep it measures, compares and draws."""

    # Its children carry the screen's `load-only` class, so the pane itself stays shown:
    # in the prompt-length mode it is an empty, zero-height box in the form.
    DEFAULT_CSS = "LoadPane { height: auto; }"

    # run_load calls these back; by message, so that they would work from a thread too.
    # Both come here, in the order they were sent: a level's last tick before its point.
    @dataclass
    class PointMeasured(Message, bubble=False):
        point: LoadPoint

    @dataclass
    class Ticked(Message, bubble=False):
        tick: LoadTick

    @dataclass
    class Progressed(Message):
        """Where the run stands, for the screen's progress bar and run line."""

        fraction: float
        line: str

    def __init__(self, results: LoadSweepResults) -> None:
        super().__init__()
        self.results = results
        """The load mode's plot, notes, legend and table, in the screen's results column."""
        self.result: LoadResult | None = None
        """The load sweep's result, its points appended as they are measured."""
        self.progress: LoadProgress | None = None
        self.ceiling: Ceiling | None = None
        """The roofline's batched-decode output tok/s, where this machine's is known."""
        self.overlay: LoadOverlay | None = None
        """A saved load sweep loaded to compare with (F9 in the load mode)."""
        self._version = 0

    def compose(self) -> ComposeResult:
        yield Static(
            "Each level's users send short synthetic prompts that ignore EOS, each the "
            "next when its last reply ends (or a rate: 1 2 req/s).",
            classes="hint load-only",
        )
        defaults = asdict(LoadForm())
        for label, field_id, name in LOAD_FIELDS:
            with Horizontal(classes="field load-only"):
                yield Label(label, classes="field-label")
                yield Input(defaults[name], id=field_id, compact=True)

    def form(self) -> LoadForm:
        """The fields as typed."""
        return LoadForm(
            **{name: self.query_one(f"#{fid}", Input).value for _, fid, name in LOAD_FIELDS}
        )

    # -- a run ---------------------------------------------------------------------------
    def begin(self, card: ModelCard | None) -> LoadResult:
        """A fresh run of the form's levels, the results cleared for it; `measure` runs it.

        Raises ValueError in words, and then everything stays as it was."""
        config = read_load_form(self.form(), card, fresh_seed())
        # Partial until the last level is in: an export mid-run says so.
        self.result = LoadResult(config, complete=False)
        self.progress = LoadProgress(config)
        self._version += 1
        self.results.clear()
        self.results.show_overlay(self.overlay, [])
        return self.result

    def run_line(self) -> str:
        """Where the run stands ("warm-up", "level 2 of 4 · 2 users · …"); "" before one."""
        return self.progress.line() if self.progress is not None else ""

    async def measure(self, engine: Engine, result: LoadResult) -> str:
        """Measure `result`'s levels (from `begin`) on `engine`, each point shown as it
        comes; the status line's words once all are. Raises what `run_load` raises."""
        config = result.config
        card = engine.card
        # Reading the model's geometry touches the disk: off the loop.
        context = config.prompt_len + config.output_len // 2
        ceiling = await asyncio.to_thread(load_ceiling, card, context) if card else None
        self.ceiling = ceiling
        if ceiling is not None:
            result.hardware = {"key": "cpu"}
        await run_load(
            engine,
            config,
            on_point=self._point,
            on_progress=self._tick,
            ceiling=ceiling,
            result=result,
        )
        result.complete = True
        return done_words(result.points)

    def stopped_words(self) -> str:
        """The status line after F6 stopped a run: what was measured is kept."""
        done = len(self.result.points) if self.result is not None else 0
        return (
            f"Stopped: the requests in flight were aborted; "
            f"{fmt.count(done, 'load level')} measured, kept for F7/F8 export."
        )

    def exportable(self) -> LoadResult | None:
        """The result F7/F8 write, once a level is in (partial until the last is)."""
        result = self.result
        return result if result is not None and result.points else None

    def _point(self, point: LoadPoint) -> None:
        self.post_message(self.PointMeasured(point))

    def _tick(self, tick: LoadTick) -> None:
        self.post_message(self.Ticked(tick))

    def on_load_pane_point_measured(self, message: PointMeasured) -> None:
        self.results.add_row(message.point)
        live = self._live()
        self.results.show_notes(live)
        self.results.show_overlay(self.overlay, live)
        if self.progress is not None:
            self.progress.level_done(message.point)
        self._version += 1

    def on_load_pane_ticked(self, message: Ticked) -> None:
        progress = self.progress
        if progress is None:
            return
        progress.tick = message.tick
        # Worded now, not when the screen gets it: a point that lands in between must not
        # move this tick's time left.
        self.post_message(self.Progressed(progress.fraction(), progress.line()))

    # -- a saved load run to compare with --------------------------------------------------
    def compare_with(self, path: Path, saved: SavedLoad) -> str:
        """Draw `saved` (read from `path`) under the live run; the status line's words."""
        overlay = self.overlay = LoadOverlay(path, saved)
        self._version += 1
        self.results.show_overlay(overlay, self._live())
        levels = [p for p in saved.result.points if p.ok and p.output_throughput > 0]
        return (
            f"Loaded {path.name}: a load sweep, {fmt.count(len(levels), 'level')}, "
            f"drawn as {overlay.mark}."
        )

    # -- drawing -------------------------------------------------------------------------
    async def redraw(self, renderer: PlotRenderer, version: int) -> None:
        """Draw the plot from the points so far; `version`: the screen's count of its own
        changes (the mode, for one), which redraw it as the pane's own changes do."""
        await self.results.redraw(
            renderer, self._live(), self.ceiling, self.overlay, (version, self._version)
        )

    def _live(self) -> list[LoadPoint]:
        return self.result.points if self.result is not None else []
