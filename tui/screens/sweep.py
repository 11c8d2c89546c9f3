"""SweepScreen: a prompt-length sweep, plotted as its points arrive, exported as JSON/CSV."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, ScrollableContainer, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, DataTable, Header, Input, Label, ProgressBar, Static

from bench.sweep import (
    SweepConfig,
    SweepFileError,
    SweepPoint,
    SweepResult,
    floors_for_card,
    load_saved_sweeps,
    run_sweep,
)
from engine.errors import KvscopeError
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    ModelCard,
    ProgressCallback,
    RequestFinished,
    StepListener,
)
from engine.stats import percentile
from tui import axes
from tui import format as fmt
from tui.plotting import Figure, PlotRenderer, Series
from tui.sweep_overlay import Overlay, overlay_series, overlay_text
from tui.widgets.plot import Plot
from tui.widgets.pruned_footer import PrunedFooter

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from textual.app import ComposeResult

    from engine.protocol import Engine

KEY = "[$primary]·[/] each run  [$primary]•[/] mean  [$success]▫[/] roofline floor"
KEY_ITL = (
    "[$accent]·[/] each run  [$accent]•[/] median  [$error]•[/] p99  [$success]▫[/] roofline floor"
)


def default_prompt_lens(card: ModelCard | None, output_len: int) -> tuple[int, ...]:
    """Powers of two that fit both walls with room for the output: the lengths that
    measure something rather than fail."""
    if card is None:
        return SweepConfig().prompt_lens
    limit = min(card.max_model_len, card.kv_pool_tokens) - output_len
    lens = [1 << k for k in range(6, 24) if (1 << k) <= limit]
    return tuple(lens[-4:]) or (max(16, limit),)


def parse_lens(text: str) -> tuple[int, ...]:
    """ "512, 1024 2048" -> (512, 1024, 2048); raises ValueError on anything else."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError("no prompt lengths")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class RunPoint:
    """One request of one run, as it finished: plotted before its length is summed up."""

    prompt_len: int
    ttft_ms: float
    median_itl_ms: float | None


MEASURED_MARK = "•"
RUN_MARK = "·"
FLOOR_MARK = "▫"


def sweep_figures(
    points: list[SweepPoint],
    runs: list[RunPoint] | None = None,
    columns: int = 60,
    rows: int = 10,
    overlay: Overlay | None = None,
) -> tuple[Figure | None, Figure | None]:
    """(TTFT vs prompt length, ITL vs prompt length): each run's requests as they finish,
    a loaded sweep's mean TTFT and median ITL (`overlay`), the means and medians of the
    lengths done, and the roofline floors. No two of these share a glyph."""
    runs = runs or []
    good = sorted((p for p in points if p.ok and p.metrics), key=lambda p: p.prompt_len)
    saved_ttft = overlay_series(overlay, "mean_ttft_ms")
    saved_itl = overlay_series(overlay, "median_itl_ms")
    if not good and not runs and not saved_ttft and not saved_itl:
        return None, None
    xs = tuple(float(p.prompt_len) for p in good)

    def series(key: str, role: str, marker: str, kind: str = "line") -> Series | None:
        if not good or not all(p.value(key) is not None for p in good):
            return None
        ys = tuple(p.value(key) or 0.0 for p in good)
        # One point is a line of no length: draw it as a point.
        shape = "scatter" if len(good) == 1 else kind
        return Series(xs, ys, role=role, kind=shape, marker=marker)  # type: ignore[arg-type]

    def run_series(ys: list[tuple[int, float]], role: str) -> Series | None:
        if not ys:
            return None
        return Series(
            tuple(float(x) for x, _ in ys),
            tuple(y for _, y in ys),
            role=role,
            kind="scatter",
            marker=RUN_MARK,
        )

    ttft = [
        s
        for s in (
            run_series([(r.prompt_len, r.ttft_ms) for r in runs], "series"),
            # Under the live means: where both fall on one cell, the live run shows.
            *saved_ttft,
            series("mean_ttft_ms", "series", MEASURED_MARK, "scatter"),
            series("ttft_floor_ms", "p50", FLOOR_MARK, "scatter"),
        )
        if s
    ]
    itl = [
        s
        for s in (
            run_series(
                [(r.prompt_len, r.median_itl_ms) for r in runs if r.median_itl_ms is not None],
                "series-alt",
            ),
            *saved_itl,
            series("median_itl_ms", "series-alt", MEASURED_MARK, "scatter"),
            series("p99_itl_ms", "p99", MEASURED_MARK, "scatter"),
            series("itl_floor_ms", "p50", FLOOR_MARK, "scatter"),
        )
        if s
    ]
    saved_xs = [x for s in (*saved_ttft, *saved_itl) for x in s.xs]
    right = max([*xs, *(float(r.prompt_len) for r in runs), *saved_xs], default=1.0) * 1.05

    def figure(all_series: list[Series]) -> Figure | None:
        if not all_series:
            return None
        top = max(max(s.ys) for s in all_series if s.ys)
        return Figure(
            tuple(all_series),
            xaxis=axes.token_axis(right, columns),
            yaxis=axes.duration_axis(top, axes.plot_rows(rows, xlabel=False)),
        )

    return figure(ttft), figure(itl)


def run_label(done: int, config: SweepConfig) -> str:
    """What the sweep is doing now, from the number of runs done: "512 tok, run 2/3"."""
    if done < config.warmup:
        return f"warm-up {done + 1}/{config.warmup}"
    measured = done - config.warmup
    index = measured // config.runs
    if index >= len(config.prompt_lens):
        return "finishing"
    run = measured % config.runs + 1
    return f"{config.prompt_lens[index]:,} tok, run {run}/{config.runs}"


def eta_seconds(finished_units: list[tuple[int, float]], remaining_lens: list[int]) -> float | None:
    """Time left for runs of `remaining_lens`, from the runs timed so far.

    A run's time grows with its prompt: fit seconds = a + b × tokens through the runs
    done (a flat average while only one length is known), and never less than zero.
    """
    if not remaining_lens:
        return 0.0
    if not finished_units:
        return None
    xs = [float(n) for n, _ in finished_units]
    ys = [t for _, t in finished_units]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var <= 0:
        slope = mean_y / mean_x if mean_x > 0 else 0.0
        base = 0.0
    else:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        base = mean_y - slope * mean_x
    return sum(max(0.0, base + slope * n) for n in remaining_lens)


class _TappedEngine:
    """The engine as run_sweep sees it, with every finished request reported as it ends.

    run_sweep reports a length only when all its runs are done; a sweep of long prompts
    would show nothing for minutes. This reports each request the moment it finishes.
    """

    def __init__(self, engine: Engine, on_finished: Callable[[RequestFinished], None]) -> None:
        self._engine = engine
        self._on_finished = on_finished

    @property
    def card(self) -> ModelCard | None:
        return self._engine.card

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        return self._engine.start(progress)

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self._engine.add_step_listener(listener)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        async for event in self._engine.stream(request):
            if isinstance(event, RequestFinished):
                self._on_finished(event)
            yield event

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        return self._engine.chat_prompt_ids(messages)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        return self._engine.synthetic_prompt(num_tokens, suffix, seed)

    def shutdown(self) -> None:
        self._engine.shutdown()


class SweepScreen(Screen[None]):
    """Runs `bench.sweep.run_sweep` in a worker; points are drawn as they come in."""

    CSS_PATH = "sweep.tcss"
    # Narrow (80x24): the form, the plots and the whole table one under the other, in
    # one scrolling column, instead of a table cut to a few rows and columns.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("f6", "run", "Run / stop"),
        Binding("f7", "export('json')", "Export JSON"),
        Binding("f8", "export('csv')", "Export CSV"),
        Binding("f9", "load", "Load JSON"),
    ]

    running: reactive[bool] = reactive(False)
    """A sweep is in progress."""

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

    def __init__(self, engine: Engine, renderer: PlotRenderer) -> None:
        super().__init__()
        self.engine = engine
        self.renderer = renderer
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

    def compose(self) -> ComposeResult:
        card = self.engine.card
        defaults = SweepConfig()
        yield Header()
        with ScrollableContainer(id="sweep-body"):
            with VerticalScroll(id="sweep-form"):
                yield Static(
                    "Each run sends exact-length synthetic prompts that ignore EOS, so every "
                    "point generates the same number of tokens.",
                    classes="hint",
                )
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
                    with Horizontal(classes="field"):
                        yield Label(label, classes="field-label")
                        yield Input(value, id=field_id, compact=True)
                yield Button("Run sweep (F6)", id="run", variant="primary", compact=True)
                # The bar's own ETA assumes equal steps; runs of longer prompts take
                # longer, so the ETA on the run line is fitted to the prompt lengths.
                yield ProgressBar(total=1, show_eta=False, id="sweep-progress")
                yield Static("", id="sweep-run")
                yield Static("", id="sweep-status")
                with Horizontal(classes="field"):
                    yield Label("export to", classes="field-label")
                    yield Input("kvscope-sweep", id="export-path", compact=True)
                with Horizontal(id="export-buttons"):
                    yield Button("JSON (F7)", id="export-json", compact=True)
                    yield Button("CSV (F8)", id="export-csv", compact=True)
                with Horizontal(classes="field", id="load-field"):
                    yield Label("compare with", classes="field-label")
                    yield Input(
                        "kvscope-sweep.json",
                        id="load-path",
                        placeholder="a saved sweep .json",
                        compact=True,
                    )
                yield Button("Load JSON (F9)", id="load", compact=True)
            with Vertical(id="sweep-results"):
                with Vertical(classes="box", id="sweep-ttft-box") as box:
                    box.border_title = "TTFT vs prompt tokens"
                    box.border_subtitle = KEY
                    yield Plot("points appear as they are measured", id="sweep-ttft")
                with Vertical(classes="box", id="sweep-itl-box") as box:
                    box.border_title = "ITL vs prompt tokens · median, p99"
                    box.border_subtitle = KEY_ITL
                    yield Plot("points appear as they are measured", id="sweep-itl")
                yield Static("", id="sweep-overlay")
                yield DataTable(id="sweep-table", cursor_type="row", zebra_stripes=True)
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
        self.sub_title = "prompt-length sweep"
        blink = getattr(getattr(self.app, "settings", None), "cursor_blink", True)
        for field in self.query(Input):
            field.cursor_blink = blink
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
            self._status("Stopped; the points measured so far are kept and can be exported.")
            return
        if self.engine.card is None:
            self._status("The engine is not ready yet.", error=True)
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
                _TappedEngine(self.engine, self._request_finished),
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
            f("ttft_pct_of_floor"),
            f("itl_pct_of_floor"),
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

    async def _redraw(self) -> None:
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
        result = self.result()
        if result is None:
            why = (
                "no prompt length has finished all its runs yet"
                if self.running
                else "run a sweep first"
            )
            self._status(f"Nothing to export yet: {why}.", error=True)
            return
        base = self.query_one("#export-path", Input).value.strip() or "kvscope-sweep"
        path = Path(base).expanduser().with_suffix(f".{kind}")
        try:
            path.write_text(result.to_json() if kind == "json" else result.to_csv(), "utf-8")
        except OSError as exc:
            self._status(f"Could not write {path}: {exc.strerror or exc}", error=True)
            return
        self._status(f"Wrote {len(result.points)} points to {path.resolve()}")

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
            sweeps = await asyncio.to_thread(load_saved_sweeps, path)
        except SweepFileError as exc:
            self._status(exc.plain(), error=True)
            return
        except Exception as exc:
            self._status(f"Cannot load {path}: {type(exc).__name__}: {exc}", error=True)
            return
        overlay = self.overlay = Overlay(path, tuple(sweeps))
        self._version += 1
        self._show_overlay()
        lengths = {p.prompt_len for s in sweeps for p in s.result.points if p.ok}
        configs = f"configs {' and '.join(s.label for s in sweeps)}, " if overlay.is_compare else ""
        marks = " and ".join(mark for mark, _ in overlay.marked())
        self._status(
            f"Loaded {path.name}: {configs}{fmt.count(len(lengths), 'prompt length')}, "
            f"drawn as {marks}."
        )
        if self.has_class("-narrow"):
            # One column at 80x24: the charts and the legend are below the form.
            body = self.query_one("#sweep-body", ScrollableContainer)
            body.scroll_to_widget(self.query_one("#sweep-results"), animate=False, top=True)

    def _show_overlay(self) -> None:
        """The loaded sweep's legend and ratios, and its glyphs in the charts' keys."""
        legend = self.query_one("#sweep-overlay", Static)
        overlay = self.overlay
        legend.display = overlay is not None
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
            self.query_one("#run", Button).label = "Stop (F6)" if running else "Run sweep (F6)"

    def action_close(self) -> None:
        if self.running:
            self.workers.cancel_group(self, "sweep")
            self.notify("The sweep was stopped.", severity="warning")
        self.dismiss()

    def _status(self, text: str, *, error: bool = False) -> None:
        status = self.query_one("#sweep-status", Static)
        status.set_class(error, "-error")
        status.update(Text(text))
