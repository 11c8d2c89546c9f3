"""A saved sweep drawn over the live one (A/B runs): its points in both charts, what it
was, and the live / saved ratio at each prompt length both have measured. A saved load
sweep (`LoadOverlay`) is drawn the same way on the load plot, compared level by level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.content import Content
from textual.markup import escape

from tui import format as fmt
from tui.load_figure import plotted
from tui.plotting import Series

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from bench.load_result import LoadPoint
    from bench.sweep_files import SavedLoad, SavedSweep
    from bench.sweep_result import SweepConfig, SweepPoint

OVERLAY_ROLE = "p90"
"""The theme's warning colour: no series of the live sweep uses it."""
OVERLAY_STYLE = "$warning"
"""The colour the Plot gives OVERLAY_ROLE, for the keys written in text."""
OVERLAY_MARKS = ("◆", "◇", "+", "×")
"""One glyph per saved config (a compare file has two), none shared with the live run's."""


@dataclass(frozen=True)
class Overlay:
    """The sweeps of one loaded file, each drawn with its own glyph."""

    path: Path
    sweeps: tuple[SavedSweep, ...]

    def marked(self) -> list[tuple[str, SavedSweep]]:
        return [(OVERLAY_MARKS[i % len(OVERLAY_MARKS)], s) for i, s in enumerate(self.sweeps)]

    @property
    def is_compare(self) -> bool:
        return any(s.label for s in self.sweeps)

    def key(self) -> str:
        """For a chart's key: "[$warning]◆[/] loaded", or one entry per compare config."""
        if not self.is_compare:
            return f"[{OVERLAY_STYLE}]{OVERLAY_MARKS[0]}[/] loaded"
        # A label is a key of the file's JSON: escaped, so a "[" in it is not markup.
        return "  ".join(
            f"[{OVERLAY_STYLE}]{mark}[/] {escape(s.label)}" for mark, s in self.marked()
        )


def _good(points: Sequence[SweepPoint], key: str) -> list[tuple[int, float]]:
    return sorted((p.prompt_len, v) for p in points if p.ok and (v := p.value(key)) is not None)


def overlay_series(overlay: Overlay | None, key: str) -> list[Series]:
    """One scatter per saved config of figure `key` ("mean_ttft_ms", "median_itl_ms")."""
    if overlay is None:
        return []
    out = []
    for mark, saved in overlay.marked():
        good = _good(saved.result.points, key)
        if good:
            out.append(
                Series(
                    tuple(float(n) for n, _ in good),
                    tuple(v for _, v in good),
                    role=OVERLAY_ROLE,
                    kind="scatter",
                    marker=mark,
                )
            )
    return out


@dataclass(frozen=True)
class Ratio:
    """Live / saved at one prompt length (None where the saved figure is zero)."""

    prompt_len: int
    ttft: float | None
    """Mean TTFT, live over saved."""
    itl: float | None
    """Median ITL, live over saved."""


def _over(live: float | None, saved: float | None) -> float | None:
    return live / saved if live is not None and saved else None


def ratios(live: Sequence[SweepPoint], saved: SavedSweep) -> list[Ratio]:
    """Live / saved, for every prompt length measured in both (live order, by length)."""
    theirs = {p.prompt_len: p for p in saved.result.points if p.ok and p.metrics is not None}
    out = []
    for p in sorted((p for p in live if p.ok), key=lambda p: p.prompt_len):
        q = theirs.get(p.prompt_len)
        if q is not None:
            out.append(
                Ratio(
                    p.prompt_len,
                    _over(p.value("mean_ttft_ms"), q.value("mean_ttft_ms")),
                    _over(p.value("median_itl_ms"), q.value("median_itl_ms")),
                )
            )
    return out


def describe(saved: SavedSweep) -> str:
    """What was measured: "config A: --max-num-batched-tokens 256 · Qwen… · 32 output
    tokens · 1 run a length · 4 at once"."""
    result = saved.result
    config = result.config
    parts = []
    if saved.label:
        parts.append(f"config {saved.label}: {saved.flags or '(default flags)'}")
    model = (result.model or {}).get("name")
    if isinstance(model, str) and model:
        parts.append(model)
    parts.append(fmt.count(config.output_len, "output token"))
    parts.append(f"{fmt.count(config.runs, 'run')} a length")
    parts.append(f"{config.concurrency} at once")
    if not result.complete:
        parts.append("partial: the sweep was stopped")
    return " · ".join(parts)


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "–"


def ratio_line(
    live: Sequence[SweepPoint], live_config: SweepConfig | None, saved: SavedSweep, mark: str
) -> str:
    """ "live / ◆  64 tok: TTFT 1.02x, ITL 0.98x · 128 tok: …", or why there is none yet."""
    head = f"live / {mark}"
    if not any(p.ok for p in live):
        return f"{head}: run a sweep to compare (mean TTFT and median ITL at each length)"
    rows = ratios(live, saved)
    if not rows:
        theirs = ", ".join(f"{n:,}" for n, _ in _good(saved.result.points, "mean_ttft_ms"))
        return f"{head}: no prompt length in common yet (saved: {theirs})"
    cells = " · ".join(f"{r.prompt_len:,} tok: TTFT {_x(r.ttft)}, ITL {_x(r.itl)}" for r in rows)
    line = f"{head}  {cells}"
    if live_config is not None and live_config.output_len != saved.result.config.output_len:
        # The median token sits at a different context length: ITL is not like for like.
        line += (
            f"  (output lengths differ: {live_config.output_len:,} live,"
            f" {saved.result.config.output_len:,} saved)"
        )
    return line


def overlay_text(
    overlay: Overlay, live: Sequence[SweepPoint], live_config: SweepConfig | None
) -> Content:
    """The overlay's legend: the file, each config it holds, and the ratios to the live run."""
    labels = ", ".join(s.label for s in overlay.sweeps)
    if not overlay.is_compare:
        what = "a saved sweep"
    elif len(overlay.sweeps) == 2:
        what = f"both configs ({labels}) of a bench --compare file"
    else:
        what = f"{fmt.count(len(overlay.sweeps), 'config')} ({labels}) of a bench --compare file"
    lines = [Content.from_markup("Overlaid: $name, $what", name=overlay.path.name, what=what)]
    for mark, saved in overlay.marked():
        lines.append(
            Content.from_markup(f"[{OVERLAY_STYLE}]$mark[/] $text", mark=mark, text=describe(saved))
        )
        lines.append(Content(ratio_line(live, live_config, saved, mark)))
    return Content("\n").join(lines)


# -- a saved load sweep on the load plot -------------------------------------------------------


@dataclass(frozen=True)
class LoadOverlay:
    """A saved load run (F9 in the load mode), drawn under the live load points."""

    path: Path
    saved: SavedLoad
    mark: str = OVERLAY_MARKS[0]

    def key(self) -> str:
        return f"[{OVERLAY_STYLE}]{self.mark}[/] loaded"

    def series(self) -> list[Series]:
        """The saved points, output tok/s against median ITL, as the live ones are drawn."""
        good = plotted(self.saved.result.points)
        if not good:
            return []
        return [
            Series(
                tuple(p.output_throughput for p in good),
                tuple(p.median_itl_ms for p in good),
                role=OVERLAY_ROLE,
                kind="scatter",
                marker=self.mark,
            )
        ]


def describe_load(saved: SavedLoad) -> str:
    """What was measured: "Qwen… · 1, 2, 4, 8 users · 64-token prompts · 32 output tokens
    · 8 requests a level"."""
    result = saved.result
    config = result.config
    parts = []
    model = (result.model or {}).get("name")
    if isinstance(model, str) and model:
        parts.append(model)
    levels = ", ".join(level_words(config.mode, v) for v in config.levels)
    parts.append(f"{levels} {'users' if config.mode == 'concurrency' else 'req/s'}")
    parts.append(f"{config.prompt_len:,}-token prompts")
    parts.append(fmt.count(config.output_len, "output token"))
    if config.num_prompts is not None:
        parts.append(f"{fmt.count(config.num_prompts, 'request')} a level")
    if not result.complete:
        parts.append("partial: the sweep was stopped")
    return " · ".join(parts)


def level_words(mode: str, value: float) -> str:
    if mode == "concurrency":
        return f"{int(value)}"
    return "inf" if value == float("inf") else f"{value:g}"


@dataclass(frozen=True)
class LoadRatio:
    """Live / saved at one load level (None where the saved figure is zero)."""

    label: str
    throughput: float | None
    """Output tokens/s, live over saved."""
    itl: float | None
    """Median ITL, live over saved."""


def load_ratios(live: Sequence[LoadPoint], saved: SavedLoad) -> list[LoadRatio]:
    """Live / saved, for every load level measured in both (in the live order)."""
    theirs = {p.label: p for p in plotted(saved.result.points)}
    out = []
    for p in plotted(live):
        q = theirs.get(p.label)
        if q is not None:
            out.append(
                LoadRatio(
                    p.label,
                    _over(p.output_throughput, q.output_throughput),
                    _over(p.median_itl_ms, q.median_itl_ms),
                )
            )
    return out


def load_ratio_line(live: Sequence[LoadPoint], saved: SavedLoad, mark: str) -> str:
    """ "live / ◆  1 user: tok/s 1.02x, ITL 0.98x · 2 users: …", or why there is none yet."""
    head = f"live / {mark}"
    if not plotted(live):
        return f"{head}: run a load sweep to compare (output tok/s and median ITL per level)"
    rows = load_ratios(live, saved)
    if not rows:
        theirs = ", ".join(p.label for p in plotted(saved.result.points))
        return f"{head}: no load level in common yet (saved: {theirs})"
    cells = " · ".join(f"{r.label}: tok/s {_x(r.throughput)}, ITL {_x(r.itl)}" for r in rows)
    return f"{head}  {cells}"


def load_overlay_text(overlay: LoadOverlay, live: Sequence[LoadPoint]) -> Content:
    """The load overlay's legend: the file, what it measured, and the ratios to the live run."""
    return Content("\n").join(
        [
            Content.from_markup("Overlaid: $name, a saved load sweep", name=overlay.path.name),
            Content.from_markup(
                f"[{OVERLAY_STYLE}]$mark[/] $text",
                mark=overlay.mark,
                text=describe_load(overlay.saved),
            ),
            Content(load_ratio_line(live, overlay.saved, overlay.mark)),
        ]
    )
