"""The roofline plot: every engine step a point under this machine's roofs (issue #32).

x is a step's arithmetic intensity (FLOPs per byte it moved), y the FLOP/s it achieved
(its FLOPs over its duration), both on log10 axes. The sloped roof is the memory
bandwidth (y = bandwidth × x): a step under it is memory-bound, waiting on bytes. The flat
roof is the peak compute: a step under it is compute-bound. They meet at the ridge
(peak / bandwidth FLOPs per byte). A long prompt's prefill lands right of the ridge, near
the flat roof; decode reads all the weights for a token or a few per request, so it sits
far left, on the slope, and moves right as the batch grows (the batch shares the reads).

No step can do better than a roof: a point above one means the roofs (a calibration) or
the counts are wrong, and the plot says so in words instead of calling it 110 % of peak.

Pure functions of the telemetry's points, so a test reads what the plot would show
without drawing it (as tui/figures.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import KvscopeError
from tui.axes import Axis
from tui.plotting import Figure, Note, Rule, Series

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.events import ModelCard
    from tui.telemetry.buffers import PerfPoint, StepKind

FRESH_S = 5.0
"""A point from a step that ended within this many seconds (engine time) of the newest is
drawn bright; older ones dim, so the latest request's steps stand out."""

# Each kind its own glyph and colour role, so they read apart without colour too.
MARKS: dict[StepKind, tuple[str, str]] = {
    "prefill": ("■", "series"),
    "decode": ("●", "series-alt"),
    "mixed": ("◆", "p90"),
}
KIND_VARS: dict[StepKind, str] = {
    "prefill": "$primary",
    "decode": "$accent",
    "mixed": "$warning",
}
FOCUS_MARK = "◉"
"""The steps of the chat reply in focus (the one the ITL plot and the `w` line follow),
in their kind's colour, never dim: one reply's prefill and decode picked out of the rest."""
OLD_ROLE = "axes"
ROOF_ROLE = "p50"
ABOVE_ROLE = "marker"
ABOVE_MARK = "!"

NO_PERF_WORDS = (
    "no step has FLOP and byte counts yet: vLLM counts them with --enable-mfu-metrics "
    "(a server exports them as vllm:estimated_flops_per_gpu_total)"
)
"""What the box says when the engine counts no step's work."""

MFU_FLAG = "--enable-mfu-metrics"
"""The `vllm serve` flag that makes a server export its FLOP and byte counters."""

WINDOWS_WORDS = "scrape windows, not steps"
"""What an attached roofline's points are: a server shows no steps, only its counters'
growth between two /metrics scrapes (all its requests, the whole window)."""


def remote_no_perf_words(ran_tokens: bool) -> str:
    """What an attached roofline box says before its first point: the server ran tokens
    and counted no FLOPs (its flag is off), or no window with work has come yet."""
    if ran_tokens:
        return (
            "this server counts no FLOPs or bytes (its vllm:estimated_*_per_gpu_total "
            f"counters are absent or zero): start it with vllm serve … {MFU_FLAG}"
        )
    return (
        "no scrape window with counted work yet: one point per window once the server "
        f"runs requests (a server started with {MFU_FLAG} counts them)"
    )


@dataclass(frozen=True, slots=True)
class Roofs:
    """A machine's two roofs: peak FLOP/s (flat) and memory bandwidth (the slope)."""

    name: str  # whose: "this CPU (calibrated)", "the fake's set machine", "NVIDIA H100 SXM"
    peak_flops: float
    bandwidth: float  # bytes/s

    @property
    def ridge(self) -> float:
        """The intensity where the roofs meet, FLOPs per byte."""
        return self.peak_flops / self.bandwidth

    def roof(self, intensity: float) -> float:
        """The most FLOP/s a step of `intensity` can achieve here."""
        return min(self.peak_flops, self.bandwidth * intensity)

    def words(self) -> str:
        """The two peaks, for the plot's frame: "4 TFLOP/s, 32 GB/s"."""
        return f"{si(self.peak_flops, ' ')}FLOP/s, {si(self.bandwidth, ' ')}B/s"


def machine_roofs(card: ModelCard) -> Roofs | str:
    """The roofs of the machine the card's engine runs on, or why they are not known.

    A CPU's come from its cached calibration only: measuring takes seconds of every core,
    which the engine's own steps would feel. The steps run here also when a GPU's pool is
    emulated, so the roofs stay this machine's.
    """
    if card.device == "fake":
        from engine.fake import FAKE_MEM_BANDWIDTH, FAKE_PEAK_FLOPS

        return Roofs("the fake's set machine", FAKE_PEAK_FLOPS, FAKE_MEM_BANDWIDTH)
    if card.device == "cpu":
        from roofline.cpu_calibration import load_cached_cpu_profile

        profile = load_cached_cpu_profile()
        if profile is None:
            return (
                "this CPU has no calibrated roofs yet: `kvscope roofline --gpu cpu` measures them"
            )
        return Roofs(
            "this CPU (calibrated)", profile.peak_bf16_flops, profile.mem_bandwidth_bytes_s
        )
    if card.device == "cuda":
        from engine.nvml import gpu_devices
        from roofline.hardware import load_profile

        names = [d.name for d in gpu_devices()]
        for name in names:
            # NVML's "NVIDIA H100 80GB HBM3" is the profile "h100-80gb-hbm3", "NVIDIA L4" is
            # "l4". A MIG slice ("… MIG 1g.10gb") matches none: its roofs are a share.
            short = name.removeprefix("NVIDIA ")
            for key in (name, short, short.replace(" ", "-")):
                try:
                    p = load_profile(key, option="--hardware")
                except KvscopeError:
                    continue
                return Roofs(p.name, p.peak_bf16_flops, p.mem_bandwidth_bytes_s)
        seen = ", ".join(names) or "none seen by NVML"
        return f"no shipped profile for this GPU ({seen}): its roofs are not known"
    return f"the roofs of a {card.device or 'remote'} engine's machine are not known here"


@dataclass(frozen=True, slots=True)
class RooflineSummary:
    """What the roofline's title and key say about what it draws."""

    steps: int = 0  # counted steps in the buffer
    kinds: tuple[StepKind, ...] = ()  # the kinds drawn, in MARKS' order
    above: int = 0  # steps above a roof: a calibration problem
    dim: bool = False  # some points drawn dim (older than FRESH_S)
    source: str = ""  # who counted (the newest point's)
    roofs: Roofs | None = None
    focus: str = ""  # the reply picked out, as the timeline labels it ("" none)
    focus_steps: int = 0  # its steps drawn as FOCUS_MARK

    def focus_words(self) -> str:
        """Which reply's steps are picked out and how many ("" when none is in focus)."""
        if not self.focus:
            return ""
        n = self.focus_steps
        if not n:
            return f"no step of {self.focus} counted"
        return f"{FOCUS_MARK} {self.focus}'s {n:,} step{'s' if n != 1 else ''}"

    def above_words(self) -> str:
        """The calibration problem in words ("" when every step is under the roofs)."""
        if not self.above:
            return ""
        steps = "1 step" if self.above == 1 else f"{self.above:,} steps"
        return f"⚠ {steps} above a roof: calibration problem"


def si(value: float, sep: str = "") -> str:
    """A number with an SI prefix, for axis ticks ("10G", "1.5T", "0.1") and, with a `sep`
    of " " and a unit after it, for rates ("4 T" + "FLOP/s")."""
    if value <= 0:
        return "0" + sep
    for power, prefix in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if value >= 10.0**power * (1 - 1e-9):
            scaled = value / 10.0**power
            return f"{scaled:.3g}{sep}{prefix}"
    return f"{value:.3g}{sep}"


def log_axis(lo: float, hi: float, cells: int) -> Axis:
    """A log10 axis over whole decades covering [lo, hi], in log10 units, labelled at
    decades with SI prefixes, at most one label per few `cells` so they never run into
    each other."""
    k_lo = math.floor(math.log10(lo))
    k_hi = max(math.ceil(math.log10(hi)), k_lo + 1)
    decades = k_hi - k_lo
    every = max(1, math.ceil(decades / max(1, cells)))
    ticks = tuple(float(k) for k in range(k_lo, k_hi + 1) if (k - k_lo) % every == 0)
    return Axis(float(k_lo), float(k_hi), ticks, tuple(si(10.0**t) for t in ticks))


def roofline_figure(
    points: Iterable[PerfPoint],
    roofs: Roofs | None,
    columns: int,
    rows: int = 10,
    *,
    focus: str | None = None,
    focus_label: str = "",
) -> tuple[Figure | None, RooflineSummary]:
    """The steps' points under the roofs (None: no point to draw).

    The steps that ran request `focus` (a chat reply) are drawn as FOCUS_MARK, over the
    rest; `focus_label` is its name in the key (the timeline's short label).
    """
    named = (focus_label or focus) if focus is not None else ""
    shown = [p for p in points if p.intensity > 0 and p.flops_per_s > 0]
    if not shown:
        return None, RooflineSummary(roofs=roofs, focus=named)
    newest = max(p.end_s for p in shown)
    xs = [p.intensity for p in shown]
    ys = [p.flops_per_s for p in shown]
    x_lo, x_hi = min(xs) / 2, max(xs) * 2
    y_lo, y_hi = min(ys) / 2, max(ys) * 2
    if roofs is not None:
        x_lo, x_hi = min(x_lo, roofs.ridge / 4), max(x_hi, roofs.ridge * 4)
        y_hi = max(y_hi, roofs.peak_flops * 2)
    xaxis = log_axis(x_lo, x_hi, max(1, (columns - 8) // 6))
    yaxis = log_axis(y_lo, y_hi, max(1, rows - 3))
    # One glyph per plot cell and kind: thousands of decode steps land on a few cells, and
    # drawing each would cost the frame for nothing. The newest point of each cell wins.
    cell_x = (xaxis.hi - xaxis.lo) / max(columns - 8, 1)
    cell_y = (yaxis.hi - yaxis.lo) / max(rows - 2, 1)
    cells: dict[tuple[str, str, int, int], tuple[float, float]] = {}
    above = 0
    focused = 0
    dim = False
    kinds: set[StepKind] = set()
    for p in shown:
        lx, ly = math.log10(p.intensity), math.log10(p.flops_per_s)
        if roofs is not None and p.flops_per_s > roofs.roof(p.intensity):
            above += 1
            role, mark = ABOVE_ROLE, ABOVE_MARK
        else:
            mark, role = MARKS[p.kind]
            if focus is not None and focus in p.requests:
                mark = FOCUS_MARK
                focused += 1
            elif newest - p.end_s > FRESH_S:
                role, dim = OLD_ROLE, True
            kinds.add(p.kind)
        key = (role, mark, round((lx - xaxis.lo) / cell_x), round((ly - yaxis.lo) / cell_y))
        cells.pop(key, None)  # re-inserted last: the dim ones are drawn before the bright
        cells[key] = (lx, ly)
    series: list[Series] = []
    rules: list[Rule] = []
    notes: list[Note] = []
    if roofs is not None:
        ridge = math.log10(roofs.ridge)
        peak = math.log10(roofs.peak_flops)
        # The slope from where it enters the plot (its bottom or left edge) to the ridge.
        start = max(xaxis.lo, yaxis.lo - math.log10(roofs.bandwidth))
        slope = (start, start + math.log10(roofs.bandwidth))
        series.append(Series((slope[0], ridge, xaxis.hi), (slope[1], peak, peak), ROOF_ROLE))
        rules.append(Rule(ridge, OLD_ROLE, vertical=True))
        notes.append(Note(ridge, peak - cell_y, "ridge", OLD_ROLE))

    # Dim first, then bright, then the reply in focus, then the ones above a roof: the
    # newest steps are on top, and the picked-out reply over them.
    def layer(group: tuple[tuple[str, str], object]) -> int:
        role, mark = group[0]
        if role == ABOVE_ROLE:
            return 3
        return 2 if mark == FOCUS_MARK else 0 if role == OLD_ROLE else 1

    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for (role, mark, _, _), xy in cells.items():
        groups.setdefault((role, mark), []).append(xy)
    for (role, mark), at in sorted(groups.items(), key=layer):
        series.append(
            Series(
                tuple(x for x, _ in at),
                tuple(y for _, y in at),
                role=role,
                kind="scatter",
                marker=mark,
            )
        )
    summary = RooflineSummary(
        steps=len(shown),
        kinds=tuple(k for k in MARKS if k in kinds),
        above=above,
        dim=dim,
        source=max(shown, key=lambda p: p.end_s).source,
        roofs=roofs,
        focus=named,
        focus_steps=focused,
    )
    # The frame says how to read the plot, or, before anything else, that it is wrong.
    label = summary.above_words() or (f"log-log · {roofs.words()}" if roofs else "log-log")
    figure = Figure(
        series=tuple(series),
        rules=tuple(rules),
        notes=tuple(notes),
        xaxis=xaxis,
        yaxis=yaxis,
        label=label,
    )
    return figure, summary


def roofline_title(summary: RooflineSummary, *, windows: bool = False) -> str:
    """The box's title: what is drawn, how many steps (or, attached, scrape windows) and
    who counted them, and a point above a roof before anything else would be read off
    the plot."""
    if summary.steps and windows:
        # Short: the box is 58 columns wide at 160x48, and this is what a point is.
        n = summary.steps
        title = f"Roofline: {n:,} scrape window{'s' if n != 1 else ''}, not steps"
        title += f" ({summary.source})"
        return title + (f" · {summary.above_words()}" if summary.above else "")
    # With a reply in focus, its words take the axes' place: the box is 58 columns wide
    # at 160x48, and the key has no room left for them beside the roofs' name.
    title = "Roofline" if summary.focus else "Roofline: FLOP/s vs FLOP/byte"
    if summary.steps:
        title += f" · {summary.steps:,} steps ({summary.source})"
    if summary.focus:
        title += f" · {summary.focus_words()}"
    if summary.above:
        title += f" · {summary.above_words()}"
    return title


def roofline_key(summary: RooflineSummary, unknown: str = "", *, windows: bool = False) -> str:
    """The box's key: only what the figure draws, in its glyphs and colours; or, where the
    roofs are not known, why (`unknown`). Attached (`windows`), it says first that each
    point is a scrape window (a window's kind is what its requests ran in it)."""
    entries = [f"[{KIND_VARS[k]}]{MARKS[k][0]}[/] {k}" for k in summary.kinds]
    if summary.above:
        entries.append(f"[$error]{ABOVE_MARK}[/] above a roof")
    if summary.roofs is not None:
        entries.append(f"[$success]─[/] roofs: {summary.roofs.name}")
    elif unknown:
        entries.append(f"no roofs: {unknown}")
    if summary.dim:
        entries.append(f"dim: over {FRESH_S:.0f} s old")
    return ("per window: " if windows else "") + "  ".join(entries)
