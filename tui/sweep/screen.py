"""SweepScreen: a prompt-length sweep or a load sweep (F4 switches), plotted as its points
arrive, exported as JSON/CSV, and compared with a saved one (F9); F3 draws the points
under the machine's roofs instead of the usual plots.

The screen holds its composition, its keys, the mode, what both modes share (F6 and the
run's worker, the progress bar, the status line) and the prompt-length mode. The load
mode is a pane of its own (`load_pane.LoadPane`), and the files it writes and reads are
`files`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, ScrollableContainer, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, DataTable, Header, Input, Label, ProgressBar, Static

from bench.sweep import floors_for_card, run_sweep
from bench.sweep_files import SavedLoad
from bench.sweep_result import SweepConfig, SweepPoint, SweepResult
from engine.errors import KvscopeError
from engine.stats import percentile
from roofline.point_perf import PointRoofs
from tui import format as fmt
from tui.bench_roofline_plot import load_rows, roofline_plot, saved_rows, sweep_rows, undrawable
from tui.roofline_figure import machine_roofs
from tui.sweep import files
from tui.sweep.load_pane import LoadPane
from tui.sweep.load_results import LoadSweepResults
from tui.sweep.overlay import Overlay, overlay_text
from tui.sweep.prompt_view_model import (
    KEY,
    KEY_ITL,
    RunPoint,
    default_prompt_lens,
    eta_seconds,
    floor_cell,
    parse_lens,
    run_label,
    sweep_figures,
)
from tui.sweep.tapped_engine import TappedEngine
from tui.widgets.plot import Plot
from tui.widgets.pruned_footer import PrunedFooter

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from bench.load_result import LoadResult
    from bench.sweep_files import SavedSweep
    from engine.events import RequestFinished
    from engine.protocol import Engine
    from tui.bench_roofline_plot import RooflineRow
    from tui.plotting import PlotRenderer
    from tui.sweep.overlay import LoadOverlay
    from tui.telemetry.host_watch import HostWatch


SweepMode = Literal["length", "load"]
"""What the screen sweeps: the prompt length at one concurrency, or the load (users)."""
EXPORT_NAMES: dict[SweepMode, str] = {"length": "kvscope-sweep", "load": "kvscope-load"}
MODE_WORDS: dict[SweepMode, str] = {"length": "prompt-length sweep", "load": "load sweep"}
SWEPT: dict[SweepMode, str] = {"length": "prompt length", "load": "load"}
NOTHING_YET: dict[SweepMode, tuple[str, str]] = {
    "length": ("no prompt length has finished all its runs yet", "run a sweep first"),
    "load": ("no load level has finished yet", "run a load sweep first"),
}
"""Why F7/F8 have nothing to write yet: during a run, and before any."""


class SweepScreen(Screen[None]):
    """Runs `bench.sweep.run_sweep` in a worker; points are drawn as they come in. In the
    load mode the worker runs the `LoadPane`'s load sweep instead."""

    CSS_PATH = "screen.tcss"
    # Narrow (80x24): the form, the plots and the whole table one under the other, in
    # one scrolling column, instead of a table cut to a few rows and columns.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("f3", "toggle_roofline", "Roofline", tooltip="Roofline plot on/off"),
        Binding("f4", "toggle_mode", "Length / load"),
        Binding("f6", "run", "Run / stop"),
        Binding("f7", "export('json')", "Export JSON"),
        Binding("f8", "export('csv')", "Export CSV"),
        Binding("f9", "load", "Load JSON"),
    ]

    running: reactive[bool] = reactive(False)
    """A sweep is in progress."""
    mode: reactive[SweepMode] = reactive[SweepMode]("length")
    """Which sweep the form, the plots and the exports are about (F4 switches)."""
    show_roofline: reactive[bool] = reactive(False)
    """The roofline view (F3): the mode's points under the roofs, in place of its plots."""

    @dataclass
    class PointMeasured(Message):
        point: SweepPoint

    @dataclass
    class ProgressMade(Message):
        done: int
        total: int

    @dataclass
    class RequestMeasured(Message):
        """One request of a run finished (`unit`: how many runs were done before it)."""

        event: RequestFinished
        unit: int

    def __init__(
        self,
        engine: Engine,
        renderer: PlotRenderer,
        *,
        host: HostWatch | None = None,
        cursor_blink: bool = True,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.renderer = renderer
        self.host_watch = host
        """The app's busy-host watch (the chat's steps feed it); None: no host line."""
        self.cursor_blink = cursor_blink
        self.config: SweepConfig | None = None
        self.points: list[SweepPoint] = []
        self.runs: list[RunPoint] = []
        self._version = 0
        self._done_units = 0
        self._total_units = 0
        self._unit_started = 0.0
        self._unit_times: list[tuple[int, float]] = []  # (prompt length, seconds) per run
        self.overlay: Overlay | None = None
        """A saved sweep loaded to compare with (F9), drawn under the live points."""
        self._host_checked = -1.0
        # The load mode: its pane in the form column, its results in the results column.
        self.load_pane = LoadPane(LoadSweepResults(id="load-sweep-results", classes="load-only"))
        self._saved_last: dict[SweepMode, bool] = {"length": False, "load": False}
        """Per mode: a file was loaded (F9) after the last run began, so the roofline view
        draws the file's points; a run begun after it draws its own again."""
        self._roofs: PointRoofs | str | None = None  # this engine's machine's, once asked
        self._roofline_drawn: tuple[object, ...] | None = None

    @property
    def load_result(self) -> LoadResult | None:
        """The load sweep's result (the load pane's), its points appended as measured."""
        return self.load_pane.result

    @property
    def load_overlay(self) -> LoadOverlay | None:
        """A saved load sweep loaded to compare with (F9 in the load mode)."""
        return self.load_pane.overlay

    def compose(self) -> ComposeResult:
        card = self.engine.card
        defaults = SweepConfig()
        yield Header()
        with ScrollableContainer(id="sweep-body"):
            with VerticalScroll(id="sweep-form"):
                yield Button(self._mode_label(), id="mode", compact=True)
                yield Static(
                    "Each run sends exact-length synthetic prompts that ignore EOS, so every "
                    "point generates the same number of tokens.",
                    classes="hint length-only",
                )
                yield self.load_pane
                for label, field_id, value in (
                    (
                        "prompt lengths",
                        "lens",
                        " ".join(map(str, default_prompt_lens(card, defaults.output_len))),
                    ),
                    ("output tokens", "output-len", str(defaults.output_len)),
                    ("runs per length", "runs", str(defaults.runs)),
                    ("warm-up runs", "warmup", str(defaults.warmup)),
                    ("concurrency", "concurrency", str(defaults.concurrency)),
                ):
                    with Horizontal(classes="field length-only"):
                        yield Label(label, classes="field-label")
                        yield Input(value, id=field_id, compact=True)
                yield Button("Run sweep (F6)", id="run", variant="primary", compact=True)
                # The bar's own ETA assumes equal steps; runs of longer prompts take
                # longer, so the ETA on the run line is fitted to the prompt lengths.
                yield ProgressBar(total=1, show_eta=False, id="sweep-progress")
                yield Static("", id="sweep-run")
                yield Static("", id="sweep-status")
                yield Static("", id="sweep-host")
                with Horizontal(classes="field"):
                    yield Label("export to", classes="field-label")
                    yield Input(
                        str(files.sweeps_folder() / "kvscope-sweep"),
                        id="export-path",
                        compact=True,
                    )
                with Horizontal(id="export-buttons"):
                    yield Button("JSON (F7)", id="export-json", compact=True)
                    yield Button("CSV (F8)", id="export-csv", compact=True)
                with Horizontal(classes="field", id="load-field"):
                    yield Label("compare with", classes="field-label")
                    yield Input(
                        str(files.sweeps_folder() / "kvscope-sweep.json"),
                        id="load-path",
                        placeholder="a saved sweep .json",
                        compact=True,
                    )
                yield Button("Load JSON (F9)", id="load", compact=True)
            with Vertical(id="sweep-results"):
                with Vertical(classes="box", id="sweep-roofline-box") as box:
                    box.border_title = "Roofline · FLOP/s against FLOP/byte (F3: the usual plots)"
                    yield Static("", id="sweep-roofline")
                yield self.load_pane.results
                with Vertical(classes="box length-only", id="sweep-ttft-box") as box:
                    box.border_title = "TTFT vs prompt tokens"
                    box.border_subtitle = KEY
                    yield Plot("points appear as they are measured", id="sweep-ttft")
                with Vertical(classes="box length-only", id="sweep-itl-box") as box:
                    box.border_title = "ITL vs prompt tokens · median, p99"
                    box.border_subtitle = KEY_ITL
                    yield Plot("points appear as they are measured", id="sweep-itl")
                yield Static("", id="sweep-overlay")
                yield DataTable(
                    id="sweep-table", cursor_type="row", zebra_stripes=True, classes="length-only"
                )
        yield PrunedFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(
            "prompt",
            "TTFT mean",
            "TTFT p99",
            "ITL median",
            "ITL p99",
            "tok/s",
            "TTFT % floor",
            "ITL % floor",
            "result",
        )
        self.set_interval(1 / 10, self._redraw)
        self.sub_title = MODE_WORDS[self.mode]
        for field in self.query(Input):
            field.cursor_blink = self.cursor_blink
        self._show_overlay()
        self._status("Set the lengths and press F6 (or Run sweep).")

    # -- running ---------------------------------------------------------------------------
    def _read_config(self) -> SweepConfig:
        def number(field_id: str) -> int:
            raw = self.query_one(f"#{field_id}", Input).value.strip()
            try:
                return int(raw)
            except ValueError:
                raise ValueError(
                    f"{field_id.replace('-', ' ')}: {raw!r} is not a whole number"
                ) from None

        try:
            lens = parse_lens(self.query_one("#lens", Input).value)
        except ValueError:
            raise ValueError(
                "prompt lengths: give whole numbers separated by spaces or commas"
            ) from None
        config = SweepConfig(
            prompt_lens=lens,
            output_len=number("output-len"),
            runs=number("runs"),
            warmup=number("warmup"),
            concurrency=number("concurrency"),
        )
        config.validate()
        return config

    def action_run(self) -> None:
        if self.running:
            self.workers.cancel_group(self, "sweep")
            self.running = False
            self._stopped()
            return
        if self.engine.card is None:
            self._status("The engine is not ready yet.", error=True)
            return
        if self.mode == "load":
            self._start_load()
            return
        try:
            config = self._read_config()
        except (ValueError, KvscopeError) as exc:
            words = exc.plain() if isinstance(exc, KvscopeError) else str(exc)
            self._status(words, error=True)
            return
        self.config = config
        self._saved_last["length"] = False
        self.points = []
        self.runs = []
        self._unit_times = []
        self._done_units = 0
        self._unit_started = time.monotonic()
        self._version += 1
        self.query_one(DataTable).clear()
        self._show_overlay()
        self.running = True
        self._status("Running…")
        self._scroll_to_results()
        self._run(config)

    @work(group="sweep", exclusive=True, exit_on_error=False)
    async def _run(self, config: SweepConfig) -> None:
        try:
            # The CPU's calibration takes a few seconds the first time: off the loop.
            floors = await asyncio.to_thread(floors_for_card, self.engine.card, config.output_len)
            result = await run_sweep(
                TappedEngine(self.engine, self._request_finished),
                config,
                on_point=self._point,
                on_progress=self._progress,
                floors=floors,
            )
        except KvscopeError as exc:
            self._status(exc.plain(), error=True)
        except Exception as exc:
            self._status(f"The sweep stopped: {type(exc).__name__}: {exc}", error=True)
        else:
            # Counted from the result, not from the table: the last point's message may
            # not have been handled yet when run_sweep returns.
            done = result.points
            failed = sum(1 for p in done if not p.ok)
            tail = f" ({failed} failed: see the table)" if failed else ""
            self._status(
                f"Done: {fmt.count(len(done), 'prompt length')} measured{tail}. F7/F8 export."
            )
            self.query_one("#sweep-run", Static).update("")
        finally:
            self.running = False

    def _stopped(self) -> None:
        """F6 during a run: the worker is cancelled, and with it every request in flight
        (a stream whose consumer walks away is aborted in the engine)."""
        self.query_one("#sweep-run", Static).update("")
        if self.mode == "load":
            self._status(self.load_pane.stopped_words())
            return
        self._status("Stopped; the points measured so far are kept and can be exported.")

    def _scroll_to_results(self) -> None:
        """One column at 80x24: bring the charts into view, below the form, as a run starts
        or a saved sweep is loaded."""
        if self.has_class("-narrow"):
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)

    # -- the load sweep: the pane measures, the screen shows the run as both modes do -----
    def _start_load(self) -> None:
        try:
            result = self.load_pane.begin(self.engine.card)
        except ValueError as exc:
            self._status(str(exc), error=True)
            return
        self._saved_last["load"] = False
        self.query_one(ProgressBar).update(total=1000, progress=0)
        self.running = True
        self._status("Running…")
        self.query_one("#sweep-run", Static).update(Text(self.load_pane.run_line()))
        self._scroll_to_results()
        self._run_load(result)

    @work(group="sweep", exclusive=True, exit_on_error=False)
    async def _run_load(self, result: LoadResult) -> None:
        try:
            words = await self.load_pane.measure(self.engine, result)
        except KvscopeError as exc:
            self._status(exc.plain(), error=True)
        except Exception as exc:
            self._status(f"The load sweep stopped: {type(exc).__name__}: {exc}", error=True)
        else:
            self._status(words)
            self.query_one("#sweep-run", Static).update("")
            self.query_one(ProgressBar).update(total=1000, progress=1000)
        finally:
            self.running = False

    def on_load_pane_progressed(self, message: LoadPane.Progressed) -> None:
        if not self.running:
            return  # stopped: the run line was cleared, and stays so
        self.query_one(ProgressBar).update(total=1000, progress=round(1000 * message.fraction))
        self.query_one("#sweep-run", Static).update(Text(message.line))

    # -- the mode ----------------------------------------------------------------------------
    def _mode_label(self) -> str:
        other: SweepMode = "load" if self.mode == "length" else "length"
        return f"Sweeping {SWEPT[self.mode]} · F4: {SWEPT[other]}"

    def action_toggle_mode(self) -> None:
        if self.running:
            self._status(f"A {MODE_WORDS[self.mode]} is running: stop it first (F6).", error=True)
            return
        self.mode = "load" if self.mode == "length" else "length"

    def watch_mode(self, old: SweepMode, mode: SweepMode) -> None:
        self.set_class(mode == "load", "-load")
        if not self.is_mounted:
            return
        self.sub_title = MODE_WORDS[mode]
        self.query_one("#mode", Button).label = self._mode_label()
        self.query_one("#run", Button).label = self._run_label()
        # A path still at the other mode's default follows the mode; a typed one stays.
        for field_id, suffix in (("#export-path", ""), ("#load-path", ".json")):
            field = self.query_one(field_id, Input)
            followed = files.follow_mode(
                field.value, f"{EXPORT_NAMES[old]}{suffix}", f"{EXPORT_NAMES[mode]}{suffix}"
            )
            if followed is not None:
                field.value = followed
        self._show_overlay()
        self._version += 1
        # The other mode's finished run must not leave its 100% over this one's form.
        self.query_one(ProgressBar).update(total=1000, progress=0)
        self._status(
            "Set the load levels and press F6 (or Run sweep)."
            if mode == "load"
            else "Set the lengths and press F6 (or Run sweep)."
        )

    def _run_label(self) -> str:
        return "Stop (F6)" if self.running else "Run sweep (F6)"

    # run_sweep calls these; by message, so that they would work from a thread too.
    def _point(self, point: SweepPoint) -> None:
        self.post_message(self.PointMeasured(point))

    def _progress(self, done: int, total: int) -> None:
        self.post_message(self.ProgressMade(done, total))

    def _request_finished(self, event: RequestFinished) -> None:
        self.post_message(self.RequestMeasured(event, self._done_units))

    def on_sweep_screen_point_measured(self, message: PointMeasured) -> None:
        point = message.point
        self.points.append(point)
        self._version += 1

        def f(key: str) -> str:
            v = point.value(key)
            return f"{v:,.1f}" if v is not None else "–"

        result = Text("ok") if point.ok else Text(f"✗ {point.error or 'failed'}", style="bold")
        self.query_one(DataTable).add_row(
            f"{point.prompt_len:,}",
            f("mean_ttft_ms"),
            f("p99_ttft_ms"),
            f("median_itl_ms"),
            f("p99_itl_ms"),
            f("output_throughput"),
            floor_cell(point, "ttft_pct_of_floor"),
            floor_cell(point, "itl_pct_of_floor"),
            result,
        )
        self._show_overlay()

    def on_sweep_screen_progress_made(self, message: ProgressMade) -> None:
        bar = self.query_one(ProgressBar)
        bar.update(total=max(1, message.total), progress=message.done)
        config = self.config
        now = time.monotonic()
        if config is not None and message.done > self._done_units:
            # The run that just ended, timed, with its prompt length (warm-ups excluded).
            ended = self._done_units - config.warmup
            if 0 <= ended < len(config.prompt_lens) * config.runs:
                length = config.prompt_lens[ended // config.runs]
                self._unit_times.append((length, now - self._unit_started))
            self._unit_started = now
        self._done_units = message.done
        self._total_units = message.total
        if config is not None and self.running and message.done < message.total:
            self.query_one("#sweep-run", Static).update(Text(self.run_line()))

    def run_line(self) -> str:
        """ "512 tok, run 2/3 · about 1 min left" (or without the ETA before one is known)."""
        config = self.config
        if config is None:
            return ""
        label = run_label(self._done_units, config)
        measured = self._done_units - config.warmup
        remaining = [
            config.prompt_lens[u // config.runs]
            for u in range(max(0, measured), len(config.prompt_lens) * config.runs)
        ]
        eta = eta_seconds(self._unit_times, remaining)
        return f"{label} · about {fmt.duration(eta)} left" if eta is not None else label

    def on_sweep_screen_request_measured(self, message: RequestMeasured) -> None:
        config = self.config
        ev = message.event
        if config is None or message.unit < config.warmup or ev.ttft_s is None:
            return  # warm-ups measure nothing
        itl = list(ev.itl_s)
        self.runs.append(
            RunPoint(
                ev.prompt_tokens,
                ev.ttft_s * 1000.0,
                percentile(itl, 50) * 1000.0 if itl else None,
            )
        )
        self._version += 1

    def _show_host(self) -> None:
        # A busy host spoils a sweep more than a chat: its points are the measurement.
        now = time.monotonic()
        if now - self._host_checked < 1.0:
            return
        self._host_checked = now
        warning = self.host_watch.warning() if self.host_watch is not None else None
        box = self.query_one("#sweep-host", Static)
        box.display = warning is not None
        if warning is not None:
            box.update(Text(f"{warning.words}: these points measure the host too"))

    async def _redraw(self) -> None:
        self._show_host()
        if self.show_roofline:
            self._redraw_roofline()
            return
        if self.mode == "load":
            await self.load_pane.redraw(self.renderer, self._version)
            return
        ttft_plot = self.query_one("#sweep-ttft", Plot)
        itl_plot = self.query_one("#sweep-itl", Plot)
        width, height = ttft_plot.content_size
        ttft, itl = sweep_figures(self.points, self.runs, width, height, self.overlay)
        plots = [(ttft_plot, ttft), (itl_plot, itl)]
        for plot, figure in plots:
            plot.set_figure(figure, self._version)
        jobs = [(plot, job) for plot, _ in plots if (job := plot.job())]
        if not jobs:
            return
        drawn = await self.renderer.draw([job for _, job in jobs])
        for (plot, job), ansi in zip(jobs, drawn, strict=True):
            if plot.is_mounted:
                plot.apply(job, ansi)

    # -- the roofline view (F3) -------------------------------------------------------------
    def action_toggle_roofline(self) -> None:
        self.show_roofline = not self.show_roofline

    def watch_show_roofline(self, shown: bool) -> None:
        self.set_class(shown, "-roofline")
        self._roofline_drawn = None  # drawn afresh at the next tick

    def roofline_view(self) -> tuple[str, list[RooflineRow], PointRoofs | str | None]:
        """What the roofline view draws in this mode: whose points (in words), their rows,
        and the roofs. The live run's, or the file loaded for this mode (F9) when it came
        after the run began or there is no live point."""
        path: Path | None = None
        saved: SavedLoad | tuple[SavedSweep, ...] | None = None
        if self.mode == "load":
            result = self.load_result
            live = load_rows(result.points) if result is not None else []
            live_roofs = result.roofs if result is not None else None
            if (load_overlay := self.load_overlay) is not None:
                path, saved = load_overlay.path, load_overlay.saved
        else:
            live, live_roofs = sweep_rows(self.points), None
            if (overlay := self.overlay) is not None:
                path, saved = overlay.path, overlay.sweeps
        if path is not None and saved is not None and (self._saved_last[self.mode] or not live):
            rows, roofs = saved_rows(saved)
            return f"the points of {path.name}", rows, roofs
        if not isinstance(live_roofs, PointRoofs):
            live_roofs = self._machine_roofs()
        return f"this {MODE_WORDS[self.mode]}", live, live_roofs

    def _machine_roofs(self) -> PointRoofs | str:
        # Asked once: on a GPU it asks NVML for the device's name.
        if self._roofs is None:
            card = self.engine.card
            if card is None:
                return "the engine has not said what it runs on yet"
            roofs = machine_roofs(card)
            self._roofs = (
                roofs
                if isinstance(roofs, str)
                else PointRoofs(roofs.name, roofs.peak_flops, roofs.bandwidth)
            )
        return self._roofs

    def roofline_text(self, width: int, height: int) -> str:
        """The roofline view's words and plot, `width` x `height` cells."""
        whose, rows, roofs = self.roofline_view()
        if not rows:
            return (
                f"Roofline: no point yet: run a {MODE_WORDS[self.mode]} (F6) or load a saved "
                "bench JSON (F9)."
            )
        why = undrawable(rows)
        if why is not None:
            return f"Roofline of {whose}: {why}."
        lines = [f"Roofline of {whose}: {fmt.count(len(rows), 'point')}"]
        if isinstance(roofs, str):
            lines.append(f"no roofs: {roofs}")
        bare = [(label, r) for label, r in rows if r is None or r.whole is None]
        if bare:
            why_bare = bare[0][1].missing if bare[0][1] is not None else "no figures"
            lines.append(
                f"no FLOP and byte counts for {', '.join(label for label, _ in bare)}: {why_bare}"
            )
        known = roofs if isinstance(roofs, PointRoofs) else None
        try:
            plot = roofline_plot(rows, known, width, max(8, height - len(lines)))
        except Exception as exc:  # plotext refuses some sizes: the words still stand
            plot = f"(no plot at {width}x{height}: {exc})"
        return "\n".join([*lines, plot])

    def _redraw_roofline(self) -> None:
        """Drawn again only when what it shows changed: a point landed, a file was loaded,
        the mode or the size changed; not at every tick."""
        view = self.query_one("#sweep-roofline", Static)
        width, height = view.content_size
        if width < 20 or height < 4:
            return  # not laid out yet: the next tick draws it
        result = self.load_result
        key = (
            self.mode,
            self._version,
            id(result),
            len(result.points) if result is not None else 0,
            id(self.load_overlay),
            self._saved_last[self.mode],
            width,
            height,
        )
        if key == self._roofline_drawn:
            return
        self._roofline_drawn = key
        view.update(Text(self.roofline_text(width, height), no_wrap=True, overflow="crop"))

    # -- export ----------------------------------------------------------------------------
    def result(self) -> SweepResult | None:
        if self.config is None or not self.points:
            return None
        card = self.engine.card
        return SweepResult(self.config, list(self.points), model=asdict(card) if card else None)

    def action_export(self, kind: str) -> None:
        result = self.result() if self.mode == "length" else self.load_pane.exportable()
        if result is None:
            during, before = NOTHING_YET[self.mode]
            why = during if self.running else before
            self._status(f"Nothing to export yet: {why}.", error=True)
            return
        raw = self.query_one("#export-path", Input).value
        try:
            words = files.export(result, kind, raw, EXPORT_NAMES[self.mode])
        except files.FileTrouble as exc:
            self._status(str(exc), error=True)
            return
        self._status(words)

    # -- a saved sweep to compare with ---------------------------------------------------
    def action_load(self) -> None:
        raw = self.query_one("#load-path", Input).value.strip()
        if not raw:
            self._status("Give the path of a saved sweep (.json) to compare with.", error=True)
            return
        self._read_saved(Path(raw).expanduser())

    @work(group="load", exclusive=True, exit_on_error=False)
    async def _read_saved(self, path: Path) -> None:
        # On an error the status says why, and everything on the screen stays as it was.
        try:
            saved = await files.read_saved(path)
        except files.FileTrouble as exc:
            self._status(str(exc), error=True)
            return
        self._saved_last["load" if isinstance(saved, SavedLoad) else "length"] = True
        if isinstance(saved, SavedLoad):
            words = self.load_pane.compare_with(path, saved)
            hint = "" if self.mode == "load" else " F4 shows it (load sweep)."
        else:
            words = self._compare_with(path, saved)
            hint = "" if self.mode == "length" else " F4 shows them (prompt-length sweep)."
        self._status(words + hint)
        self._scroll_to_results()

    def _compare_with(self, path: Path, sweeps: list[SavedSweep]) -> str:
        """Draw the saved prompt-length sweeps of `path` under the live points; the status
        line's words."""
        overlay = self.overlay = Overlay(path, tuple(sweeps))
        self._version += 1
        self._show_overlay()
        lengths = {p.prompt_len for s in sweeps for p in s.result.points if p.ok}
        configs = f"configs {' and '.join(s.label for s in sweeps)}, " if overlay.is_compare else ""
        marks = " and ".join(mark for mark, _ in overlay.marked())
        return (
            f"Loaded {path.name}: {configs}{fmt.count(len(lengths), 'prompt length')}, "
            f"drawn as {marks}."
        )

    def _show_overlay(self) -> None:
        """The loaded sweep's legend and ratios, and its glyphs in the charts' keys."""
        legend = self.query_one("#sweep-overlay", Static)
        overlay = self.overlay
        # Set here, not by the stylesheet's mode rule, which this inline value would beat.
        legend.display = overlay is not None and self.mode == "length"
        ttft_box = self.query_one("#sweep-ttft-box")
        itl_box = self.query_one("#sweep-itl-box")
        if overlay is None:
            ttft_box.border_subtitle, itl_box.border_subtitle = KEY, KEY_ITL
            return
        legend.update(overlay_text(overlay, self.points, self.config))
        ttft_box.border_subtitle = f"{KEY}  {overlay.key()}"
        itl_box.border_subtitle = f"{KEY_ITL}  {overlay.key()}"

    @on(Button.Pressed, "#load")
    def _load_pressed(self) -> None:
        self.action_load()

    @on(Input.Submitted, "#load-path")
    def _load_submitted(self) -> None:
        self.action_load()

    @on(Button.Pressed, "#mode")
    def _mode_pressed(self) -> None:
        self.action_toggle_mode()

    @on(Button.Pressed, "#run")
    def _run_pressed(self) -> None:
        self.action_run()

    @on(Button.Pressed, "#export-json")
    def _json_pressed(self) -> None:
        self.action_export("json")

    @on(Button.Pressed, "#export-csv")
    def _csv_pressed(self) -> None:
        self.action_export("csv")

    def watch_running(self, running: bool) -> None:
        if self.is_mounted:
            self.query_one("#run", Button).label = self._run_label()

    def action_close(self) -> None:
        if self.running:
            self.workers.cancel_group(self, "sweep")
            what = "load sweep" if self.mode == "load" else "sweep"
            self.notify(f"The {what} was stopped.", severity="warning")
        self.dismiss()

    def _status(self, text: str, *, error: bool = False) -> None:
        status = self.query_one("#sweep-status", Static)
        status.set_class(error, "-error")
        status.update(Text(text))
