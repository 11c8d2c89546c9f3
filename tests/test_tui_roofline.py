"""The roofline panel (issue #32): every step a point under the machine's roofs.

The fake engine sets each step's FLOPs and bytes from its config (engine/fake.py `_perf`),
so the panel has points on virtual time; the roofs are the fake's set machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import math
import re
from typing import TYPE_CHECKING

import pytest
from rich.console import Console
from test_tui_remote import FIXTURES, RecordedServer, _attached
from tui_helpers import NARROW, WIDE, engine_ready, make_app, reply_done, settle, step_sample

from engine.clock import VirtualClock
from engine.events import GenerationRequest, SamplingSettings, ScrapeSample, StepPerf, StepSample
from engine.fake import FAKE_MEM_BANDWIDTH, FAKE_PEAK_FLOPS, FakeConfig, FakeEngine
from engine.remote.metrics import ScrapeState, cache_info, parse_metrics
from engine.remote.metrics import step_sample as remote_step_sample
from engine.sizes import kv_bytes_per_token
from roofline.hardware import shipped_geometry
from roofline.step_perf import RequestSlice, StepModel
from tui.app import KvscopeApp
from tui.roofline_figure import (
    ABOVE_MARK,
    FOCUS_MARK,
    NO_PERF_WORDS,
    ROOF_ROLE,
    Roofs,
    remote_no_perf_words,
    roofline_figure,
    roofline_title,
)
from tui.telemetry.buffers import PerfPoint, Telemetry
from tui.widgets.plot import Plot
from tui.widgets.remote_state import COUNTS_MISSING_WORDS

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from tui.plotting import Figure

SIZES = [pytest.param(NARROW, id="80x24"), pytest.param(WIDE, id="160x48")]
PROMPT = 512
OUTPUT = 16
ROOFS = Roofs("the fake's set machine", FAKE_PEAK_FLOPS, FAKE_MEM_BANDWIDTH)


def _app(pilot: Pilot[int]) -> KvscopeApp:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    return app


async def _send(pilot: Pilot[int], prompt: int) -> None:
    """A synthetic prompt of `prompt` tokens and its OUTPUT tokens, to the reply's end."""
    from textual.widgets import Input

    main = _app(pilot).main_screen
    main.controls.query_one("#max-tokens", Input).value = str(OUTPUT)
    main.controls.synthetic = True
    main.controls.slider.value = prompt
    await pilot.pause()
    await main.send("", synthetic=True)
    await reply_done(pilot)


async def _prompt_and_decode(pilot: Pilot[int]) -> None:
    """A 512-token synthetic prompt and its 16 decode steps, then F8 (the roofline)."""
    await engine_ready(pilot)
    await _send(pilot, PROMPT)
    await pilot.press("f8")
    await settle(pilot)


def _samples(config: FakeConfig | None = None) -> list[StepSample]:
    """The fake's steps for one 512-token prompt and its decode, without the app."""
    engine = FakeEngine(config, clock=VirtualClock())
    engine.start()
    samples: list[StepSample] = []
    engine.add_step_listener(samples.append)
    request = GenerationRequest(
        "r1",
        prompt_token_ids=engine.synthetic_prompt(PROMPT),
        sampling=SamplingSettings(max_tokens=OUTPUT, ignore_eos=True),
    )

    async def run() -> None:
        async for _ in engine.stream(request):
            pass
        engine.shutdown()

    asyncio.run(run())
    return [s for s in samples if not s.idle]


def _telemetry(samples: list[StepSample]) -> Telemetry:
    tel = Telemetry()
    for s in samples:
        tel.add_sample(s)
    return tel


def _drawn(figure: Figure) -> list[tuple[str, float, float]]:
    """Every step glyph the figure draws, as (marker, intensity, FLOP/s)."""
    return [
        (s.marker, 10.0**x, 10.0**y)
        for s in figure.series
        if s.kind == "scatter"
        for x, y in zip(s.xs, s.ys, strict=True)
    ]


@pytest.mark.parametrize("size", SIZES)
def test_roofline_after_a_512_token_prompt_and_its_decode(snap_compare, size) -> None:  # type: ignore[no-untyped-def]
    # The prefill right of the ridge, under the flat roof; the decode far left on the
    # slope; all of them ◉, the reply in focus (r1's 16 steps), in their kinds' colours;
    # the key names both kinds, the reply and the roofs; the title the fake's set machine.
    assert snap_compare(make_app(), terminal_size=size, run_before=_prompt_and_decode)


@pytest.mark.parametrize("size", SIZES)
async def test_f8_shows_the_roofline_with_every_step_and_keeps_the_plots_fitting(
    size: tuple[int, int],
) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await _prompt_and_decode(pilot)
        panel = app.main_screen.engine_panel
        box = panel.query_one("#roofline-box")
        plot = panel.query_one("#roofline-plot", Plot)
        assert box.display and plot.has_drawing
        # 1 prefill step (its first token comes with it) and 15 decode steps.
        title = str(box.border_title)
        assert f"{OUTPUT:,} steps (fake)" in title
        assert "roofs: the fake's set machine" in str(box.border_subtitle)
        grid = panel.query_one("#engine-grid")
        # Reachable: F8 scrolled the box into the Engine column's view.
        assert grid.region.contains_region(box.region)
        if size == WIDE:
            # Readable at 160x48: every plot box has its least height, none is squeezed.
            assert not panel.has_class("-tight")
            for other in ("#kv-box", "#itl-box", "#ttft-box", "#roofline-box"):
                assert grid.region.contains_region(panel.query_one(other).region)
        await pilot.press("f8")
        await settle(pilot)
        assert not box.display


async def test_the_box_says_in_words_when_no_step_is_counted() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        await pilot.press("f8")
        await settle(pilot)
        plot = app.main_screen.engine_panel.query_one("#roofline-plot", Plot)
        assert not plot.has_figure
        assert "--enable-mfu-metrics" in str(plot.render())
    assert "--enable-mfu-metrics" in NO_PERF_WORDS


def test_the_fakes_counts_are_set_from_its_config() -> None:
    config = FakeConfig()
    samples = _samples(config)
    weights = config.params * config.bytes_per_param
    kv = kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, 2)
    prefill, decode = samples[0], samples[1]
    assert prefill.prefill_tokens == PROMPT and prefill.perf is not None
    assert prefill.perf.flops == 2 * config.params * PROMPT
    assert prefill.perf.read_bytes == weights  # an empty cache: the weights only
    assert prefill.perf.write_bytes == kv * PROMPT
    assert decode.decode_tokens == 1 and decode.perf is not None
    assert decode.perf.flops == 2 * config.params
    # The weights once and the prompt's KV (the first output token's is written now).
    assert decode.perf.read_bytes == weights + kv * PROMPT
    assert decode.perf.write_bytes == kv
    assert all(s.perf is not None and s.perf.source == "fake" for s in samples)


def test_prefill_lands_right_of_decode_and_every_step_under_the_roofs() -> None:
    tel = _telemetry(_samples())
    figure, summary = roofline_figure(tel.perf_points, ROOFS, 100, 20)
    assert figure is not None
    assert summary.kinds == ("prefill", "decode") and summary.above == 0
    drawn = _drawn(figure)
    prefill = [x for m, x, _ in drawn if m == "■"]
    decode = [x for m, x, _ in drawn if m == "●"]
    assert prefill and decode
    assert min(prefill) > max(decode)
    # Either side of the ridge: prefill compute-bound, decode memory-bound.
    assert min(prefill) > ROOFS.ridge > max(decode)
    for _, x, y in drawn:
        assert y <= ROOFS.roof(x)
    assert "above" not in figure.label and "above" not in roofline_title(summary)
    # The roofs: a slope up to the ridge, then flat at the peak.
    (roof,) = [s for s in figure.series if s.role == ROOF_ROLE]
    assert math.isclose(10.0 ** roof.ys[-1], FAKE_PEAK_FLOPS)
    assert math.isclose(10.0 ** roof.xs[1], ROOFS.ridge)


def test_nothing_is_drawn_above_a_roof_without_the_words() -> None:
    tel = _telemetry(_samples())
    # A step that did the whole prompt's FLOPs in a microsecond: above the flat roof.
    fast = step_sample(step=99, started_at=50.0, prefill=PROMPT, duration=1e-6)
    prompt = tel.perf_points[0]
    flops = prompt.flops_per_s * 0.01  # any FLOPs: over 1 µs they beat the peak
    perf = StepPerf(flops, flops / prompt.intensity, 0.0, "fake")
    tel.add_sample(dataclasses.replace(fast, perf=perf))
    figure, summary = roofline_figure(tel.perf_points, ROOFS, 100, 20)
    assert figure is not None
    assert summary.above == 1
    words = "1 step above a roof: calibration problem"
    assert words in figure.label and words in roofline_title(summary)
    above = [(x, y) for m, x, y in _drawn(figure) if y > ROOFS.roof(x)]
    assert len(above) == 1
    assert [m for m, x, y in _drawn(figure) if y > ROOFS.roof(x)] == [ABOVE_MARK]
    # Never as a share of the peak over 100 %.
    assert "%" not in figure.label and "%" not in roofline_title(summary)
    # Older steps fade: the fake's request ended 50 s of engine time before that step.
    assert summary.dim


def test_a_mixed_step_has_its_own_mark_and_old_steps_fade() -> None:
    tel = Telemetry()
    work = StepPerf(2e9, 4e8, 0.0, "fake")  # 5 FLOPs per byte, under the slope's 160 GFLOP/s
    old = step_sample(step=1, started_at=0.0, prefill=8, decode=1, duration=1.0)
    new = step_sample(step=2, started_at=10.0, prefill=8, decode=3, duration=1.0)
    for s in (old, new):
        tel.add_sample(dataclasses.replace(s, perf=work))
    figure, summary = roofline_figure(tel.perf_points, ROOFS, 100, 20)
    assert figure is not None
    assert summary.kinds == ("mixed",) and summary.dim
    roles = {(s.marker, s.role) for s in figure.series if s.kind == "scatter"}
    # The newer step bright in the mixed colour; the one 10 s older dim, same glyph.
    assert roles == {("◆", "p90"), ("◆", "axes")}


# -- one chat reply's steps picked out ---------------------------------------------------------


def _positions(figure: Figure, marker: str) -> set[tuple[float, float]]:
    """Where the figure draws `marker`, in its own (log10) coordinates."""
    return {
        (x, y)
        for s in figure.series
        if s.kind == "scatter" and s.marker == marker
        for x, y in zip(s.xs, s.ys, strict=True)
    }


async def test_the_followed_replys_steps_are_picked_out_on_the_panel() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        # Two replies of different prompts: their steps land apart on the plot.
        await _send(pilot, PROMPT)
        await _send(pilot, 128)
        await pilot.press("f8")
        await settle(pilot)
        tel = app.telemetry
        panel = app.main_screen.engine_panel
        box = panel.query_one("#roofline-box")
        plot = panel.query_one("#roofline-plot", Plot)
        points = list(tel.perf_points)
        first = [p for p in points if "r1" in p.requests]
        second = [p for p in points if "r2" in p.requests]
        # Each ran alone: 1 prefill step (its first token with it) and 15 decode steps.
        assert len(first) == len(second) == OUTPUT and len(points) == 2 * OUTPUT

        def drawn(marker: str) -> set[tuple[float, float]]:
            figure = plot._figure
            assert figure is not None
            return _positions(figure, marker)

        def at(steps: list[PerfPoint]) -> set[tuple[float, float]]:
            return {(math.log10(p.intensity), math.log10(p.flops_per_s)) for p in steps}

        def picked_out(reply: list[PerfPoint], other: list[PerfPoint]) -> None:
            # Every ◉ is one of the reply's steps (one a plot cell: decode steps share
            # cells), its prefill among them; the other reply's prefill stays a ■.
            assert drawn(FOCUS_MARK) and drawn(FOCUS_MARK) <= at(reply)
            assert at(reply[:1]) <= drawn(FOCUS_MARK)
            assert at(other[:1]) <= drawn("■") and not at(other) & drawn(FOCUS_MARK)

        # The latest reply is the one followed: its steps are ◉, the first's are not.
        assert tel.itl_request == "r2"
        assert f"{FOCUS_MARK} r2's {OUTPUT} steps" in str(box.border_title)
        picked_out(second, first)
        # Following the first reply, as the app does for the reply it tracks (the ITL
        # plot's, the `w` line's and the timeline's), moves the highlight to it.
        tel.track_request("r1")
        await settle(pilot)
        assert f"{FOCUS_MARK} r1's {OUTPUT} steps" in str(box.border_title)
        assert "r2" not in str(box.border_title)
        picked_out(first, second)


def test_the_reply_in_focus_is_drawn_over_the_rest_and_named_in_the_title() -> None:
    tel = _telemetry(_samples())
    figure, summary = roofline_figure(tel.perf_points, ROOFS, 100, 20, focus="r1")
    assert figure is not None
    assert (summary.focus, summary.focus_steps) == ("r1", OUTPUT)
    # In their kinds' colours, never dim, over the other steps (drawn after them).
    scatter = [s for s in figure.series if s.kind == "scatter"]
    assert {s.role for s in scatter if s.marker == FOCUS_MARK} == {"series", "series-alt"}
    assert scatter[-1].marker == FOCUS_MARK
    assert f"{FOCUS_MARK} r1's {OUTPUT} steps" in roofline_title(summary)
    # Its words fit the box at 160x48 (58 columns, less its corners and padding).
    assert len(roofline_title(summary)) <= 54, roofline_title(summary)
    # A reply with no counted step is said in words; none in focus, nothing said.
    _, none = roofline_figure(tel.perf_points, ROOFS, 100, 20, focus="r9", focus_label="…9")
    assert none.focus_steps == 0 and "no step of …9 counted" in roofline_title(none)
    _, plain = roofline_figure(tel.perf_points, ROOFS, 100, 20)
    assert FOCUS_MARK not in roofline_title(plain) and "no step" not in roofline_title(plain)


# -- attached (--url): one point per scrape window ---------------------------------------------


def _counted_scrapes(interval_s: float = 3.0) -> list[ScrapeSample]:
    """The recorded server's idle and busy scrapes, then the busy window once more, with
    the estimated counters a server started with --enable-mfu-metrics exports: each busy
    window's FLOPs and bytes are kvscope's count of its prompt and output tokens on
    SmolLM2-135M (the recorded server's model), as vLLM's count is within tolerance."""
    texts = [(FIXTURES / f"metrics_{n}.txt").read_text() for n in ("idle", "busy")]
    model = StepModel(shipped_geometry("smollm2-135m-instruct"))
    prompt, output = 1158, 25  # the busy scrape's prompt and generation counters
    window = model.count([RequestSlice(prompt, prompt)]).perf
    window = StepPerf(
        window.flops + output * model.count([RequestSlice(1, prompt + output)]).perf.flops,
        window.read_bytes + output * model.count([RequestSlice(1, prompt)]).perf.read_bytes,
        window.write_bytes * (prompt + output) / prompt,
        "",
    )

    def counted(text: str, times: int) -> str:
        for name, value in (
            ("estimated_flops_per_gpu_total", window.flops),
            ("estimated_read_bytes_per_gpu_total", window.read_bytes),
            ("estimated_write_bytes_per_gpu_total", window.write_bytes),
            ("prompt_tokens_total", float(prompt)),
            ("generation_tokens_total", float(output)),
        ):
            text = re.sub(
                rf"^(vllm:{name}\{{[^}}]*\}}) \S+$",
                rf"\g<1> {value * times!r}",
                text,
                flags=re.MULTILINE,
            )
        return text

    parsed = [parse_metrics(t) for t in (texts[0], counted(texts[1], 1), counted(texts[1], 2))]
    info = cache_info(parsed[1])
    assert info is not None
    state = ScrapeState()
    return [state.update(p, 100.0 + interval_s * i, info) for i, p in enumerate(parsed)]


class CountingServer(RecordedServer):
    """The recorded server, as if started with --enable-mfu-metrics."""

    def play(self) -> None:
        for scrape in _counted_scrapes():
            self._scrapes.emit(scrape)
            self._listeners.emit(remote_step_sample(scrape))


async def _attached_roofline(pilot: Pilot[int]) -> None:
    await _attached(pilot)
    await pilot.press("f8")
    await settle(pilot)


def test_the_scrapes_carry_the_window_counts() -> None:
    scrapes = _counted_scrapes()
    assert [s.perf is not None for s in scrapes] == [False, True, True]
    first, second = scrapes[1].perf, scrapes[2].perf
    assert first is not None and second is not None
    assert first.source == "vllm counters"
    # The second window's counters grew by as much again: the same work, the same point.
    assert math.isclose(first.flops, second.flops)


@pytest.mark.parametrize("size", SIZES)
async def test_attached_the_roofline_draws_a_point_per_scrape_window(
    size: tuple[int, int],
) -> None:
    app = make_app(engine=CountingServer())
    async with app.run_test(size=size) as pilot:
        await _attached_roofline(pilot)
        panel = app.main_screen.engine_panel
        points = list(app.telemetry.perf_points)
        # One per window with counted work (the first scrape opens no window).
        assert [p.step for p in points] == [s.seq for s in _counted_scrapes()[1:]]
        assert all(p.source == "vllm counters" for p in points)
        # A window ran prompt and output tokens: both, in one point.
        assert {p.kind for p in points} == {"mixed"}
        plot = panel.query_one("#roofline-plot", Plot)
        assert plot.has_drawing
        box = panel.query_one("#roofline-box")
        assert str(box.border_title) == "Roofline: 2 scrape windows, not steps (vllm counters)"
        assert str(box.border_subtitle).startswith("per window: [$warning]◆[/$warning] mixed")
        # The server counts its work: the Server box does not ask for the flag.
        assert COUNTS_MISSING_WORDS not in _remote_text(app)


async def test_attached_without_the_counters_both_boxes_name_the_flag() -> None:
    app = make_app(engine=RecordedServer())  # recorded without --enable-mfu-metrics
    async with app.run_test(size=WIDE) as pilot:
        await _attached_roofline(pilot)
        assert not app.telemetry.perf_points
        assert app.telemetry.uncounted == 1  # the busy window ran tokens, counted none
        plot = app.main_screen.engine_panel.query_one("#roofline-plot", Plot)
        assert not plot.has_figure
        assert str(plot.render()) == remote_no_perf_words(ran_tokens=True)
        assert "--enable-mfu-metrics" in str(plot.render())
        assert "--enable-mfu-metrics" in COUNTS_MISSING_WORDS
        assert COUNTS_MISSING_WORDS in _remote_text(app)


def test_attached_roofline_snapshot(snap_compare) -> None:  # type: ignore[no-untyped-def]
    # Two scrape windows' points (◆: both kinds of token in each), the title and key
    # saying they are windows, not steps.
    assert snap_compare(
        make_app(engine=CountingServer()), terminal_size=WIDE, run_before=_attached_roofline
    )


def _remote_text(app: KvscopeApp) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(app.main_screen.engine_panel.remote_state.render())
    return console.export_text().replace("\n", " ")


# -- reachable: F8 in the footer and in help ---------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_shows_f8_and_help_lists_it(size: tuple[int, int]) -> None:
    from textual.widgets._footer import FooterKey  # not re-exported

    from tui.screens.help import HelpScreen

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await engine_ready(pilot)
        keys = {key.action: key for key in app.screen.query(FooterKey)}
        # After F1 and F5, before the rest: a narrow terminal cuts the row at its right.
        f8 = keys["toggle_roofline"]
        assert f8.region.right <= size[0] and "Roofline" in f8.render().plain
        assert keys["help"].region.x < keys["sweep"].region.x < f8.region.x
        await pilot.press("f1")
        await settle(pilot)
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        rows = dict(row for _, rows in help_screen.key_sections() for row in rows)
        assert rows["f8"] == "Roofline plot on/off"
