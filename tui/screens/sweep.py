"""SweepScreen: a prompt-length sweep, plotted as its points arrive, exported as JSON/CSV."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, ProgressBar, Static

from bench.sweep import SweepConfig, SweepPoint, SweepResult, floors_for_card, run_sweep
from engine.errors import KvscopeError
from engine.events import ModelCard
from engine.protocol import Engine
from tui.plotting import Figure, PlotRenderer, Series
from tui.widgets.plot import Plot


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


def sweep_figures(points: list[SweepPoint]) -> tuple[Figure | None, Figure | None]:
    """(TTFT vs prompt length, ITL vs prompt length) from the points measured so far."""
    good = sorted((p for p in points if p.ok and p.metrics), key=lambda p: p.prompt_len)
    if not good:
        return None, None
    xs = tuple(float(p.prompt_len) for p in good)

    def series(key: str, role: str, kind: str = "line") -> Series | None:
        if not all(key in p.metrics for p in good):
            return None
        ys = tuple(p.metrics[key] for p in good)
        # One point is a line of no length: draw it as a point.
        shape = "scatter" if len(good) == 1 else kind
        return Series(xs, ys, role=role, kind=shape)  # type: ignore[arg-type]

    ttft = [s for s in (series("mean_ttft_ms", "series"), series("ttft_floor_ms", "p50")) if s]
    itl = [
        s
        for s in (
            series("median_itl_ms", "series-alt"),
            series("p99_itl_ms", "p99"),
            series("itl_floor_ms", "p50"),
        )
        if s
    ]

    def figure(all_series: list[Series]) -> Figure:
        top = max((max(s.ys) for s in all_series), default=1.0) * 1.15 or 1.0
        return Figure(tuple(all_series), xlabel="prompt tokens", ylim=(0.0, top))

    return figure(ttft), figure(itl)


class SweepScreen(Screen[None]):
    """Runs `bench.sweep.run_sweep` in a worker; points are drawn as they come in."""

    CSS_PATH = "sweep.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("f6", "run", "Run / stop"),
        Binding("f7", "export('json')", "Export JSON"),
        Binding("f8", "export('csv')", "Export CSV"),
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

    def __init__(self, engine: Engine, renderer: PlotRenderer) -> None:
        super().__init__()
        self.engine = engine
        self.renderer = renderer
        self.config: SweepConfig | None = None
        self.points: list[SweepPoint] = []
        self._version = 0

    def compose(self) -> ComposeResult:
        card = self.engine.card
        defaults = SweepConfig()
        yield Header()
        with Horizontal(id="sweep-body"):
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
                # No ETA: it would be a wall-clock guess; the bar counts runs done.
                yield ProgressBar(total=1, show_eta=False, id="sweep-progress")
                yield Static("", id="sweep-status")
                with Horizontal(classes="field"):
                    yield Label("export to", classes="field-label")
                    yield Input("kvscope-sweep", id="export-path", compact=True)
                with Horizontal(id="export-buttons"):
                    yield Button("JSON (F7)", id="export-json", compact=True)
                    yield Button("CSV (F8)", id="export-csv", compact=True)
            with Vertical(id="sweep-results"):
                with Vertical(classes="box", id="sweep-ttft-box") as box:
                    box.border_title = "TTFT (ms) vs prompt tokens · mean"
                    yield Plot("points appear as they are measured", id="sweep-ttft")
                with Vertical(classes="box", id="sweep-itl-box") as box:
                    box.border_title = "ITL (ms) vs prompt tokens · median and p99"
                    yield Plot("points appear as they are measured", id="sweep-itl")
                yield DataTable(id="sweep-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

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
        self._version += 1
        self.query_one(DataTable).clear()
        self.running = True
        self._status("Running…")
        self._run(config)

    @work(group="sweep", exclusive=True, exit_on_error=False)
    async def _run(self, config: SweepConfig) -> None:
        try:
            # The CPU's calibration takes a few seconds the first time: off the loop.
            floors = await asyncio.to_thread(floors_for_card, self.engine.card, config.output_len)
            await run_sweep(
                self.engine,
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
            failed = sum(1 for p in self.points if not p.ok)
            tail = f" ({failed} failed: see the table)" if failed else ""
            self._status(f"Done: {len(self.points)} prompt lengths measured{tail}. F7/F8 export.")
        finally:
            self.running = False

    # run_sweep calls these; by message, so that they would work from a thread too.
    def _point(self, point: SweepPoint) -> None:
        self.post_message(self.PointMeasured(point))

    def _progress(self, done: int, total: int) -> None:
        self.post_message(self.ProgressMade(done, total))

    def on_sweep_screen_point_measured(self, message: PointMeasured) -> None:
        point = message.point
        self.points.append(point)
        self._version += 1
        m = point.metrics

        def f(key: str) -> str:
            return f"{m[key]:,.1f}" if key in m else "–"

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

    def on_sweep_screen_progress_made(self, message: ProgressMade) -> None:
        bar = self.query_one(ProgressBar)
        bar.update(total=max(1, message.total), progress=message.done)

    async def _redraw(self) -> None:
        ttft, itl = sweep_figures(self.points)
        plots = [
            (self.query_one("#sweep-ttft", Plot), ttft),
            (self.query_one("#sweep-itl", Plot), itl),
        ]
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
            self._status("Nothing to export yet: run a sweep first.", error=True)
            return
        base = self.query_one("#export-path", Input).value.strip() or "kvscope-sweep"
        path = Path(base).expanduser().with_suffix(f".{kind}")
        try:
            path.write_text(result.to_json() if kind == "json" else result.to_csv(), "utf-8")
        except OSError as exc:
            self._status(f"Could not write {path}: {exc.strerror or exc}", error=True)
            return
        self._status(f"Wrote {len(result.points)} points to {path.resolve()}")

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
