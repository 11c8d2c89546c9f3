"""SweepScreen: a prompt-length sweep or a load sweep (F4 switches), plotted as its points
arrive, exported as JSON/CSV, and compared with a saved one (F9).

The load sweep runs `bench.load_runner.run_load`, the runner behind `kvscope bench
--concurrency 1,2,4,8`, and draws the playground's throughput-vs-latency figure."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import platformdirs
from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, ScrollableContainer, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, DataTable, Header, Input, Label, ProgressBar, Static

from bench.load_result import LoadPoint, LoadResult
from bench.load_runner import run_load
from bench.sweep import floors_for_card, run_sweep
from bench.sweep_files import SavedLoad, SweepFileError, load_saved
from bench.sweep_result import SweepConfig, SweepPoint, SweepResult, fresh_seed
from engine.errors import KvscopeError
from engine.paths import private_dir, write_private
from engine.stats import percentile
from tui import format as fmt
from tui.live_load import load_ceiling
from tui.sweep.load_results import LoadSweepResults
from tui.sweep.load_view_model import LoadForm, LoadProgress, done_words, read_load_form
from tui.sweep.overlay import LoadOverlay, Overlay, overlay_text
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
    from collections.abc import Sequence

    from textual.app import ComposeResult

    from bench.load_runner import Ceiling, LoadTick
    from engine.events import RequestFinished
    from engine.protocol import Engine
    from tui.plotting import PlotRenderer
    from tui.telemetry.host_watch import HostWatch


def sweeps_folder() -> Path:
    """Where exports go unless told otherwise, written with `~` for the home folder: not
    the working folder, which in a clone of kvscope is the repository."""
    folder = Path(platformdirs.user_data_dir("kvscope")) / "sweeps"
    try:
        return Path("~") / folder.relative_to(Path.home())
    except ValueError:
        return folder


SweepMode = Literal["length", "load"]
"""What the screen sweeps: the prompt length at one concurrency, or the load (users)."""
EXPORT_NAMES: dict[SweepMode, str] = {"length": "kvscope-sweep", "load": "kvscope-load"}
MODE_WORDS: dict[SweepMode, str] = {"length": "prompt-length sweep", "load": "load sweep"}
SWEPT: dict[SweepMode, str] = {"length": "prompt length", "load": "load"}
LOAD_FIELDS = (
    ("load levels", "load-levels", "levels"),
    ("prompt tokens", "load-prompt-len", "prompt_len"),
    ("output tokens", "load-output-len", "output_len"),
    ("requests/level", "load-requests", "requests"),
    ("warm-up", "load-warmup", "warmup"),
)
"""(label, input id, LoadForm field) of the load mode's form."""


class SweepScreen(Screen[None]):
    """Runs `bench.sweep.run_sweep` in a worker; points are drawn as they come in."""

    CSS_PATH = "screen.tcss"
    # Narrow (80x24): the form, the plots and the whole table one under the other, in
    # one scrolling column, instead of a table cut to a few rows and columns.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
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

    @dataclass
    class LoadPointMeasured(Message):
        point: LoadPoint

    @dataclass
    class LoadTicked(Message):
        tick: LoadTick

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
        self.load_result: LoadResult | None = None
        """The load sweep's result, its points appended as they are measured."""
        self.load_progress: LoadProgress | None = None
        self.load_ceiling: Ceiling | None = None
        """The roofline's batched-decode output tok/s, where this machine's is known."""
        self.load_overlay: LoadOverlay | None = None
        """A saved load sweep loaded to compare with (F9 in the load mode)."""

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
                yield Static(
                    "Each level's users send short synthetic prompts that ignore EOS, each the "
                    "next when its last reply ends (or a rate: 1 2 req/s).",
                    classes="hint load-only",
                )
                form = LoadForm()
                for label, field_id, name in LOAD_FIELDS:
                    with Horizontal(classes="field load-only"):
                        yield Label(label, classes="field-label")
                        yield Input(getattr(form, name), id=field_id, compact=True)
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
                        str(sweeps_folder() / "kvscope-sweep"), id="export-path", compact=True
                    )
                with Horizontal(id="export-buttons"):
                    yield Button("JSON (F7)", id="export-json", compact=True)
                    yield Button("CSV (F8)", id="export-csv", compact=True)
                with Horizontal(classes="field", id="load-field"):
                    yield Label("compare with", classes="field-label")
                    yield Input(
                        str(sweeps_folder() / "kvscope-sweep.json"),
                        id="load-path",
                        placeholder="a saved sweep .json",
                        compact=True,
                    )
                yield Button("Load JSON (F9)", id="load", compact=True)
            with Vertical(id="sweep-results"):
                yield LoadSweepResults(id="load-sweep-results", classes="load-only")
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
        if self.has_class("-narrow"):
            # One column at 80x24: bring the plots into view as the points start to come.
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)
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
            done = len(self.load_result.points) if self.load_result is not None else 0
            self._status(
                f"Stopped: the requests in flight were aborted; "
                f"{fmt.count(done, 'load level')} measured, kept for F7/F8 export."
            )
            return
        self._status("Stopped; the points measured so far are kept and can be exported.")

    # -- the load sweep --------------------------------------------------------------------
    def _load_form(self) -> LoadForm:
        return LoadForm(
            **{name: self.query_one(f"#{fid}", Input).value for _, fid, name in LOAD_FIELDS}
        )

    def _start_load(self) -> None:
        try:
            config = read_load_form(self._load_form(), self.engine.card, fresh_seed())
        except ValueError as exc:
            self._status(str(exc), error=True)
            return
        # Partial until the last level is in: an export mid-run says so.
        self.load_result = LoadResult(config, complete=False)
        self.load_progress = LoadProgress(config)
        self._version += 1
        results = self.query_one(LoadSweepResults)
        results.clear()
        results.show_overlay(self.load_overlay, [])
        self.query_one(ProgressBar).update(total=1000, progress=0)
        self.running = True
        self._status("Running…")
        self.query_one("#sweep-run", Static).update(Text(self.load_progress.line()))
        if self.has_class("-narrow"):
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)
        self._run_load(self.load_result)

    @work(group="sweep", exclusive=True, exit_on_error=False)
    async def _run_load(self, result: LoadResult) -> None:
        config = result.config
        try:
            card = self.engine.card
            # Reading the model's geometry touches the disk: off the loop.
            context = config.prompt_len + config.output_len // 2
            ceiling = await asyncio.to_thread(load_ceiling, card, context) if card else None
            self.load_ceiling = ceiling
            if ceiling is not None:
                result.hardware = {"key": "cpu"}
            await run_load(
                self.engine,
                config,
                on_point=self._load_point,
                on_progress=self._load_tick,
                ceiling=ceiling,
                result=result,
            )
        except KvscopeError as exc:
            self._status(exc.plain(), error=True)
        except Exception as exc:
            self._status(f"The load sweep stopped: {type(exc).__name__}: {exc}", error=True)
        else:
            result.complete = True
            self._status(done_words(result.points))
            self.query_one("#sweep-run", Static).update("")
            self.query_one(ProgressBar).update(total=1000, progress=1000)
        finally:
            self.running = False

    def _load_point(self, point: LoadPoint) -> None:
        self.post_message(self.LoadPointMeasured(point))

    def _load_tick(self, tick: LoadTick) -> None:
        self.post_message(self.LoadTicked(tick))

    def on_sweep_screen_load_point_measured(self, message: LoadPointMeasured) -> None:
        results = self.query_one(LoadSweepResults)
        results.add_row(message.point)
        live = self.load_result.points if self.load_result is not None else []
        results.show_notes(live)
        results.show_overlay(self.load_overlay, live)
        if self.load_progress is not None:
            self.load_progress.level_done(message.point)
        self._version += 1

    def on_sweep_screen_load_ticked(self, message: LoadTicked) -> None:
        progress = self.load_progress
        if progress is None or not self.running:
            return
        progress.tick = message.tick
        self.query_one(ProgressBar).update(total=1000, progress=round(1000 * progress.fraction()))
        self.query_one("#sweep-run", Static).update(Text(progress.line()))

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
        export = self.query_one("#export-path", Input)
        if Path(export.value).name == EXPORT_NAMES[old]:
            export.value = str(Path(export.value).with_name(EXPORT_NAMES[mode]))
        saved = self.query_one("#load-path", Input)
        if Path(saved.value).name == f"{EXPORT_NAMES[old]}.json":
            saved.value = str(Path(saved.value).with_name(f"{EXPORT_NAMES[mode]}.json"))
        self._show_overlay()
        self._version += 1
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
        if self.mode == "load":
            points = self.load_result.points if self.load_result is not None else []
            await self.query_one(LoadSweepResults).redraw(
                self.renderer, points, self.load_ceiling, self.load_overlay, self._version
            )
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

    # -- export ----------------------------------------------------------------------------
    def result(self) -> SweepResult | None:
        if self.config is None or not self.points:
            return None
        card = self.engine.card
        from dataclasses import asdict

        return SweepResult(self.config, list(self.points), model=asdict(card) if card else None)

    def action_export(self, kind: str) -> None:
        if self.mode == "load":
            self._export_load(kind)
            return
        result = self.result()
        if result is None:
            why = (
                "no prompt length has finished all its runs yet"
                if self.running
                else "run a sweep first"
            )
            self._status(f"Nothing to export yet: {why}.", error=True)
            return
        self._write(kind, result.to_json() if kind == "json" else result.to_csv(), result.points)

    def _export_load(self, kind: str) -> None:
        result = self.load_result
        if result is None or not result.points:
            why = "no load level has finished yet" if self.running else "run a load sweep first"
            self._status(f"Nothing to export yet: {why}.", error=True)
            return
        self._write(kind, result.to_json() if kind == "json" else result.to_csv(), result.points)

    def _write(self, kind: str, text: str, points: Sequence[object]) -> None:
        """Write an export where the path field says, as a private file in a private folder."""
        raw = self.query_one("#export-path", Input).value.strip()
        base = raw or EXPORT_NAMES[self.mode]
        path = Path(base).expanduser().with_suffix(f".{kind}")
        try:
            private_dir(path.parent)
            write_private(path, text)
        except OSError as exc:
            self._status(f"Could not write {path}: {exc.strerror or exc}", error=True)
            return
        self._status(f"Wrote {len(points)} points to {path.resolve()}")

    # -- a saved sweep to compare with ---------------------------------------------------
    def action_load(self) -> None:
        raw = self.query_one("#load-path", Input).value.strip()
        if not raw:
            self._status("Give the path of a saved sweep (.json) to compare with.", error=True)
            return
        self._load(Path(raw).expanduser())

    @work(group="load", exclusive=True, exit_on_error=False)
    async def _load(self, path: Path) -> None:
        # On an error the status says why, and everything on the screen stays as it was.
        try:
            saved = await asyncio.to_thread(load_saved, path)
        except SweepFileError as exc:
            self._status(exc.plain(), error=True)
            return
        except Exception as exc:
            self._status(f"Cannot load {path}: {type(exc).__name__}: {exc}", error=True)
            return
        if isinstance(saved, SavedLoad):
            self._loaded_load(path, saved)
            return
        sweeps = saved
        overlay = self.overlay = Overlay(path, tuple(sweeps))
        self._version += 1
        self._show_overlay()
        lengths = {p.prompt_len for s in sweeps for p in s.result.points if p.ok}
        configs = f"configs {' and '.join(s.label for s in sweeps)}, " if overlay.is_compare else ""
        marks = " and ".join(mark for mark, _ in overlay.marked())
        self._status(
            f"Loaded {path.name}: {configs}{fmt.count(len(lengths), 'prompt length')}, "
            f"drawn as {marks}."
            + ("" if self.mode == "length" else " F4 shows them (prompt-length sweep).")
        )
        if self.has_class("-narrow"):
            # One column at 80x24: the charts and the legend are below the form.
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)

    def _loaded_load(self, path: Path, saved: SavedLoad) -> None:
        overlay = self.load_overlay = LoadOverlay(path, saved)
        self._version += 1
        live = self.load_result.points if self.load_result is not None else []
        self.query_one(LoadSweepResults).show_overlay(overlay, live)
        levels = [p for p in saved.result.points if p.ok and p.output_throughput > 0]
        self._status(
            f"Loaded {path.name}: a load sweep, {fmt.count(len(levels), 'level')}, "
            f"drawn as {overlay.mark}."
            + ("" if self.mode == "load" else " F4 shows it (load sweep).")
        )
        if self.has_class("-narrow"):
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)

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
