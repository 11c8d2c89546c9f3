"""kvscope's widgets and pure helpers, each hosted alone in a tiny app with the real TCSS."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.app import App, ComposeResult
from tui_helpers import block_sample, step_sample

from engine.events import EmulationInfo, ModelCard, RequestBlocks
from themes import all_themes
from tui import axes
from tui.figures import QUEUED_MARK, itl_figure, kv_figure, latency_figure
from tui.plotting import Figure, PlotJob, Series, build_plot, envelope
from tui.settings import CONFIG_DIR_ENV, AppSettings, config_dir
from tui.telemetry.buffers import LatencyPoint, Telemetry
from tui.telemetry.host_watch import HostWatch
from tui.telemetry.request_status import RequestTrack, status_of
from tui.widgets import STYLESHEETS
from tui.widgets.controls_panel import concurrency_cap
from tui.widgets.count_stepper import CountStepper
from tui.widgets.field_line import SEPARATOR, pack
from tui.widgets.kv_block_map import FREE, USED, KvBlockMap
from tui.widgets.model_card import ModelCardView
from tui.widgets.prompt_length_slider import (
    KV_POOL_CONSEQUENCE,
    MAX_MODEL_LEN_CONSEQUENCE,
    NEAR_KV_POOL,
    PromptLengthSlider,
    walls_for,
)
from tui.widgets.reply_footer import footer_fields
from tui.widgets.token_latency_view import TimedToken, TokenLatencyView

if TYPE_CHECKING:
    from pathlib import Path, PurePath

CARD = ModelCard(
    name="fake",
    path="fake",
    dtype="bfloat16",
    num_layers=30,
    num_kv_heads=3,
    head_dim=64,
    kv_bytes_per_token=23040,
    max_model_len=2048,
    block_size=16,
    total_blocks=64,
    device="fake",
)
L4 = EmulationInfo(gpu="L4", model="qwen2.5-7b", pool_tokens=1536, kv_bytes_per_token=57344)


class Host(App[None]):
    """One widget in an app that loads kvscope's real stylesheets and theme."""

    CSS_PATH: ClassVar[list[str | PurePath]] = list(STYLESHEETS)

    def __init__(self, widget: object) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget  # type: ignore[misc]

    def on_mount(self) -> None:
        for theme in all_themes():
            self.register_theme(theme)
        self.theme = "kvscope-dark"


# -- PromptLengthSlider -----------------------------------------------------------------------
def test_walls_divide_the_pool_by_concurrency_and_mark_the_emulated_gpu() -> None:
    card = dataclasses.replace(CARD, emulation=L4)
    walls = {w.kind: w for w in walls_for(card, 1)}
    assert walls["max_model_len"].tokens == 2048
    assert walls["kv_pool"].tokens == 1024
    assert walls["kv_pool"].label == "KV pool"
    assert walls["gpu"].tokens == 1536
    assert "L4" in walls["gpu"].label
    walls4 = {w.kind: w for w in walls_for(card, 4)}
    assert walls4["kv_pool"].tokens == 256
    assert walls4["kv_pool"].label == "KV pool ÷ 4 ="
    assert walls4["gpu"].tokens == 384
    assert [w.tokens for w in walls_for(card, 1)] == sorted(w.tokens for w in walls_for(card, 1))


async def test_slider_keys_move_by_small_and_big_steps_and_walls_turn_it_red() -> None:
    slider = PromptLengthSlider(value=512)
    async with Host(slider).run_test(size=(60, 16)) as pilot:
        slider.card = CARD
        slider.focus()
        await pilot.pause()
        assert slider.small_step == 16
        assert slider.big_step == 160
        assert slider.maximum == 2560
        await pilot.press("right")
        assert slider.value == 528
        await pilot.press("left", "left")
        assert slider.value == 496
        await pilot.press("pageup")
        assert slider.value == 640  # snapped to the big step's grid, then one big step
        await pilot.press("shift+right", "shift+right", "shift+right")
        assert slider.value == 1120
        assert slider.has_class("-past-wall")
        text = str(slider.render())
        assert KV_POOL_CONSEQUENCE in text
        assert MAX_MODEL_LEN_CONSEQUENCE not in text
        await pilot.press("end")
        assert slider.value == 2560
        assert MAX_MODEL_LEN_CONSEQUENCE in str(slider.render())
        await pilot.press("home")
        assert slider.value == 16
        assert not slider.has_class("-past-wall")
        assert "fits under every wall" in str(slider.render())
        slider.concurrency = 8  # 1,024 / 8 = 128 tokens per copy
        slider.value = 200
        await pilot.pause()
        assert slider.has_class("-past-wall")
        assert "KV pool ÷ 8 = 128" in str(slider.render())


def test_k_wall_leaves_room_for_the_output_in_whole_blocks() -> None:
    # Issue 9 item 4: "fits under every wall" at 2 copies of 5,760 tokens and 128 max
    # tokens was followed by a preemption. The pool here: 90 blocks of 128 = 11,520.
    card = dataclasses.replace(CARD, max_model_len=8192, block_size=128, total_blocks=90)
    k = {w.kind: w for w in walls_for(card, 2, max_tokens=128)}["kv_pool"]
    assert k.tokens == 45 * 128 - 128 == 5632
    assert k.label == "KV pool ÷ 2 − 128 out ="
    assert k.passed_by(5760)
    assert not k.passed_by(5632)
    # Just under the wall is the warning zone: a little more output crosses it.
    assert k.warns(5600)
    assert not k.warns(4000)
    assert not k.warns(5760)
    # The same arithmetic as the roofline's "requests that fit at once".
    assert 2 * card.blocks_for(5632 + 128) <= card.total_blocks
    assert 2 * card.blocks_for(5632 + 128 + 1) > card.total_blocks


def test_m_wall_is_passed_at_exactly_max_model_len() -> None:
    # vLLM refuses prompt_tokens >= max_model_len: M itself is past the wall.
    m = {w.kind: w for w in walls_for(CARD, 1)}["max_model_len"]
    assert m.passed_by(2048)
    assert not m.passed_by(2047)


async def test_slider_at_m_exactly_is_past_the_wall() -> None:
    slider = PromptLengthSlider(value=2048)
    async with Host(slider).run_test(size=(60, 16)) as pilot:
        slider.card = dataclasses.replace(CARD, total_blocks=1024)
        await pilot.pause()
        assert slider.has_class("-past-wall")
        assert MAX_MODEL_LEN_CONSEQUENCE in str(slider.render())
        slider.value = 2032
        await pilot.pause()
        assert not slider.has_class("-past-wall")


async def test_slider_warns_near_the_k_wall() -> None:
    slider = PromptLengthSlider(value=960)
    async with Host(slider).run_test(size=(60, 16)) as pilot:
        slider.card = CARD  # K = 1,024 at one copy and no output
        await pilot.pause()
        assert slider.has_class("-near-wall")
        assert not slider.has_class("-past-wall")
        assert NEAR_KV_POOL in str(slider.render())
        slider.max_tokens = 128  # K = 896 now: 960 is past it
        await pilot.pause()
        assert slider.has_class("-past-wall")
        assert not slider.has_class("-near-wall")
        assert "KV pool − 128 out = 896" in str(slider.render())


async def test_slider_shows_the_emulated_gpu_wall_with_its_name() -> None:
    slider = PromptLengthSlider(value=1600)
    async with Host(slider).run_test(size=(60, 16)) as pilot:
        slider.card = dataclasses.replace(CARD, emulation=L4)
        await pilot.pause()
        text = str(slider.render())
        assert "G L4 KV pool 1,536" in text
        # Past K and G: one sentence for both pools, not two that say the same.
        assert "past the KV pool here and on a real L4" in text
        assert slider.walls_passed()[-1].kind == "gpu"


async def test_slider_ruler_marks_walls_where_they_are() -> None:
    slider = PromptLengthSlider(value=100)
    async with Host(slider).run_test(size=(44, 16)) as pilot:
        slider.card = CARD
        await pilot.pause()
        width = slider.content_size.width
        lines = slider.render().plain.splitlines()
        track, marks = lines[1], lines[2]
        for wall in slider.walls():
            x = round(wall.tokens / slider.maximum * (width - 1))
            assert track[x] == "┃"
            assert marks[x] == wall.marker


# -- ModelCardView ----------------------------------------------------------------------------
async def test_model_card_lists_the_pool_and_the_emulation() -> None:
    view = ModelCardView()
    async with Host(view).run_test(size=(70, 12)) as pilot:
        assert "loading" in _plain(view)
        view.card = dataclasses.replace(CARD, emulation=L4)
        await pilot.pause()
        text = _plain(view)
        for expected in (
            "bfloat16 on fake",
            "max_model_len 2,048 tokens",
            "block size    16 tokens",
            "64 = 1,024 tokens",
            "22.5 KiB (23,040 B)",
            L4.label,
        ):
            assert expected in text


def _plain(widget: ModelCardView) -> str:
    from rich.console import Console

    console = Console(width=70, record=True, file=io.StringIO())
    console.print(widget.render())
    return console.export_text()


# -- KvBlockMap -------------------------------------------------------------------------------
async def test_block_map_draws_one_character_per_block_with_a_legend() -> None:
    block_map = KvBlockMap()
    async with Host(block_map).run_test(size=(40, 12)) as pilot:
        sample = block_sample((RequestBlocks("a", (0, 1, 5), 40), RequestBlocks("b", (2, 3), 20)))
        block_map.show_sample(sample)
        await pilot.pause()
        lines = block_map.as_text().plain.splitlines()
        width = block_map.content_size.width
        grid = "".join(lines[: -(-64 // width)])
        assert grid[:6] == USED * 4 + FREE + USED
        assert grid[6:] == FREE * 58
        legend = "\n".join(lines[-(-64 // width) :])
        assert "a 3 blk 40 tok" in legend
        assert "b 2 blk 20 tok" in legend
        assert "free 59/64" in legend
        assert block_map.colour_index("a") == 0
        assert block_map.colour_index("b") == 1
        # A finished request's blocks are shown free even before the next step says so.
        block_map.show_sample(sample, finished=["a"])
        assert block_map.owner_of(0) is None
        assert block_map.owner_of(2) == "b"


async def test_a_big_pool_is_drawn_with_several_blocks_per_character() -> None:
    block_map = KvBlockMap()
    block_map.max_rows = 2
    async with Host(block_map).run_test(size=(20, 12)) as pilot:
        sample = block_sample((RequestBlocks("a", tuple(range(100)), 1600),), total=1000)
        block_map.show_sample(sample)
        await pilot.pause()
        width = block_map.content_size.width
        per = block_map.blocks_per_cell(width)
        assert per == -(-1000 // (width * 2))
        cells = block_map.cells(width)
        assert len(cells) == -(-1000 // per)
        assert cells[0].owner == "a"
        assert cells[0].glyph == USED
        assert cells[-1].owner is None
        assert cells[-1].glyph == FREE
        assert f"1 char = {per} blocks" in block_map.as_text().plain


# -- TokenLatencyView ---------------------------------------------------------------------------
async def test_latency_view_wraps_and_appends_without_rewrapping() -> None:
    tokens: list[TimedToken] = []
    view = TokenLatencyView(tokens)
    async with Host(view).run_test(size=(20, 10)) as pilot:
        first_line = None
        for i in range(12):
            tokens.append(TimedToken(("" if i == 0 else " ") + f"tok{i}", 0.02, i))
            view.sync()
            await pilot.pause()
            if first_line is None:
                first_line = view._lines[0]
        # Append-only: the first wrapped line is the same object it was after one token,
        # so no sync() re-wrapped the reply from the start.
        assert view._lines[0] is first_line
        text = "".join(seg.text for y in range(view.size.height) for seg in view.render_line(y))
        assert all(f"tok{i}" in text for i in range(12))
        assert view.size.height == len(view._lines) > 1
        assert all(w <= view.size.width for w in view._line_width)


# -- CountStepper -----------------------------------------------------------------------------
async def test_count_stepper_steps_and_clamps() -> None:
    stepper = CountStepper(1, maximum=4, unit="copy", units="copies")
    async with Host(stepper).run_test(size=(30, 4)) as pilot:
        stepper.focus()
        await pilot.press("right", "right")
        assert stepper.value == 3
        assert "copies" in str(stepper.render())
        await pilot.press("end", "right")
        assert stepper.value == 4
        await pilot.press("home", "left")
        assert stepper.value == 1
        assert str(stepper.render()).endswith("copy")


# -- ControlsPanel's copies cap ---------------------------------------------------------------
def test_copies_cap_stays_16_for_a_small_pool() -> None:
    from engine.events import ModelCard

    card = ModelCard("m", "m", "bf16", 1, 1, 1, 2, 4096, 128, 10, "cpu")
    assert concurrency_cap(card) == 16
    assert concurrency_cap(dataclasses.replace(card, total_blocks=628)) == 256


# -- FieldLine, and the words of a reply's footer ---------------------------------------------
def test_footer_fields_wrap_between_fields_never_inside_one() -> None:
    fields = ("TTFT 93.0 ms", "ITL p50 37.1 ms · p99 55.0 ms", "27.4 tok/s", "hit max tokens")
    for width in range(12, 90):
        lines = pack(fields, width)
        # Every field, whole and in order: none dropped, split, merged or repeated.
        assert [part for line in lines for part in line.split(SEPARATOR)] == list(fields), width
        for line in lines:  # over the width only as one field wider than the whole line
            assert cell_len(line) <= width or SEPARATOR not in line, (width, line)
        for line, after in itertools.pairwise(lines):  # a break only where the next won't fit
            first = after.split(SEPARATOR)[0]
            assert cell_len(line + SEPARATOR + first) > width, (width, line, first)


def test_wording_agrees_with_numbers() -> None:
    from tui import format as fmt

    assert fmt.count(1, "block") == "1 block"
    assert fmt.count(2, "block") == "2 blocks"
    assert fmt.count(1, "copy", "copies") == "1 copy"
    from engine.events import RequestFinished

    one = RequestFinished("r", "length", 10, 1, 0.1, (), 0.1)
    assert "output 1 token" in " ".join(footer_fields(one))


# -- plotting and figures ---------------------------------------------------------------------
def test_envelope_keeps_spikes() -> None:
    xs = [float(i) for i in range(1000)]
    ys = [1.0] * 1000
    ys[567] = 50.0
    ex, ey = envelope(xs, ys, 40)
    assert len(ex) <= 41
    assert max(ey) == 50.0
    assert 567.0 in ex


def test_envelope_ends_at_the_value_now() -> None:
    # A full pool for a while, then the last request ends and the idle sample says 0 %:
    # squeezed into few columns, the line must still end at 0, not at the last maximum.
    xs = [float(i) for i in range(1000)]
    ys = [75.0] * 999 + [0.0]
    ex, ey = envelope(xs, ys, 40)
    assert (ex[-1], ey[-1]) == (999.0, 0.0)


def test_plot_builds_in_the_given_size_and_colours() -> None:
    figure = Figure((Series((1.0, 2.0, 3.0), (1.0, 3.0, 2.0)),), xlabel="token")
    job = PlotJob(("k",), figure, 40, 10, (("series", (255, 0, 0)), ("axes", (0, 255, 0))))
    text = Text.from_ansi(build_plot(job))
    lines = text.plain.splitlines()
    assert len(lines) == 10
    assert max(len(line) for line in lines) <= 40
    colours = {span.style.color.triplet for span in text.spans if span.style.color}  # type: ignore[union-attr]
    assert any(c is not None and (c.red, c.green, c.blue) == (255, 0, 0) for c in colours)
    # Bigger than the 80x24 plotext assumes when stdout is not a terminal: not clipped.
    big = Text.from_ansi(build_plot(PlotJob(("k",), figure, 130, 40, job.palette))).plain
    assert len(big.splitlines()) == 40
    assert max(len(line) for line in big.splitlines()) == 130


def test_figures_come_from_the_ring_buffers() -> None:
    tel = Telemetry()
    assert itl_figure(tel, 40) == (None, None)
    assert latency_figure(tel, 40)[0] is None
    assert kv_figure(tel, 40) is None
    tel.add_sample(block_sample((RequestBlocks("a", (0,), 10),)))
    figure = kv_figure(tel, 40)
    assert figure is not None
    assert figure.yaxis is not None
    assert (figure.yaxis.lo, figure.yaxis.hi) == (0.0, 100.0)


def test_ticks_are_round_and_land_on_rows() -> None:
    step, ticks = axes.nice_ticks(0, 24009.1, 5)
    assert step == 10000
    assert ticks == (0, 10000, 20000, 30000)
    token = axes.token_axis(4300, 60)
    assert token.labels[0] == "0"
    assert all(t == int(t) for t in token.ticks)
    assert "4,000" in token.labels
    small = axes.token_axis(3, 60)  # three tokens: no 0.5 ticks
    assert all(t == int(t) for t in small.ticks)
    ms = axes.duration_axis(437.0, 9)
    assert ms.labels[0] == "0"
    assert all(label.endswith(" ms") for label in ms.labels[1:])
    for tick in ms.ticks:
        mantissa = tick / 10 ** math.floor(math.log10(tick)) if tick else 1.0
        assert round(mantissa, 6) in (1.0, 2.0, 4.0, 5.0, 6.0, 8.0, 3.0)
    s = axes.duration_axis(171_900.0, 9)
    assert s.labels[-1].endswith(" s")
    assert s.labels[0] == "0"
    # Every tick is a whole number of rows above the bottom: an even scale.
    for rows in (4, 5, 6, 7, 9, 10, 13):
        axis = axes.duration_axis(437.0, rows)
        at = [(t - axis.lo) / (axis.hi - axis.lo) * (rows - 1) for t in axis.ticks]
        assert all(abs(r - round(r)) < 1e-6 for r in at)
        gaps = {round(b - a, 6) for a, b in itertools.pairwise(at)}
        assert len(gaps) == 1
    log = axes.log_duration_axis(20.0, 1500.0)
    assert log.labels == ("20 ms", "100 ms", "1 s", "2 s")
    assert axes.log_duration_axis(30.0, 90.0).labels == ("20 ms", "50 ms", "100 ms")


def test_a_queued_copy_gets_its_own_mark_and_its_queue_split_off() -> None:
    tel = Telemetry()
    tel.points.extend(
        [
            LatencyPoint("a", 512, 90.0, 37.0, 0.0, False),
            LatencyPoint("b", 4096, 1245.0, 44.0, 0.0, False),
            # Queued for 149 s: left alone it would put every other point on the axis.
            LatencyPoint("c", 4096, 150_000.0, 45.0, 148_800.0, True),
        ]
    )
    figure, summary = latency_figure(tel, 60, 12)
    assert figure is not None
    assert figure.yaxis is not None
    queued = next(s for s in figure.series if s.marker == QUEUED_MARK)
    assert queued.ys == (1200.0,)
    assert figure.yaxis.hi < 2000  # the scale is the served requests', not the queue's
    assert summary.queued == 1
    assert summary.queue_removed == 1


# -- Telemetry, HostWatch and request status --------------------------------------------------
def test_kv_plot_keeps_the_last_minute() -> None:
    tel = Telemetry()
    for i in range(200):
        tel.add_sample(step_sample(i + 1, started_at=float(i), duration=0.5, free=80))
    xs, _ys, _ = tel.kv_series()
    assert xs[0] == -60.0
    assert xs[-1] == 0.0
    assert len(xs) <= 62


def test_host_watch_names_the_load_and_wild_step_times() -> None:
    watch = HostWatch(load_average=lambda: 3.4, cores=2)
    assert watch.warning() is None  # not a CPU engine: the load is not checked
    watch.check_load = True
    warning = watch.warning()
    assert warning is not None
    assert "load 3.4 on 2 cores" in warning.words
    calm = HostWatch(load_average=lambda: 0.1, cores=2)
    calm.check_load = True
    for i in range(40):
        d = 0.023 if i % 3 else 1.1  # 23 ms, then over a second
        calm.add_sample(step_sample(i, decode=1, duration=d))
    words = calm.warning()
    assert words is not None
    assert "decode steps vary" in words.words


def test_a_lone_long_prompt_is_prefilling_not_waiting_for_blocks() -> None:
    # Seen: "waiting for KV blocks" for one 4,096-token prompt with 90 of 90 blocks free.
    track = RequestTrack("r1", prompt_tokens=4096, submitted_at=0.0)
    track.take(step_sample(started_at=0.5, blocks=(RequestBlocks("r1", (0,) * 16, 2048),)), 2048)
    where = status_of(track, step_sample(free=74), accepted=True)
    assert (where.phase, where.words) == ("prefilling", "prefilling (chunk 1 of 2)")


def test_a_copy_held_back_with_blocks_free_is_queued_by_the_token_budget() -> None:
    # Seen: 14 of 16 copies "queued for KV blocks" with 514 of 628 blocks free.
    track = RequestTrack("r1.9", prompt_tokens=4096, submitted_at=0.0)
    sample = step_sample(started_at=0.5, free=514, total=628, running=2, waiting=14)
    track.take(sample, None)
    where = status_of(track, sample, accepted=True)
    assert where.words == "queued by the scheduler (token budget)"
    short = step_sample(started_at=0.6, free=20, total=628)
    track.take(short, None)
    where = status_of(track, short, accepted=True)
    assert where.phase == "waiting_kv"
    assert where.words == "waiting for KV blocks (needs 32, 20 free)"


def test_preempted_then_decoding() -> None:
    track = RequestTrack("r2", prompt_tokens=100, submitted_at=0.0)
    track.take(step_sample(started_at=0.1, block_size=16), 100)
    track.tokens = 5
    assert status_of(track, None, accepted=True).words == "decoding"
    track.take(step_sample(started_at=0.2, block_size=16, preempted=("r2",)), None)
    assert status_of(track, None, accepted=True).words == (
        "preempted ×1 (KV pool full, 100 tokens to recompute): waiting to run again"
    )


# -- settings ---------------------------------------------------------------------------------
def test_settings_round_trip_in_the_config_dir(tui_config_dir: Path) -> None:
    assert config_dir() == tui_config_dir
    settings = AppSettings.load()
    assert settings.theme == "kvscope-dark"
    assert settings.problem is None
    settings.theme = "phosphor"
    path = settings.save()
    assert path == tui_config_dir / "settings.json"
    assert json.loads(path.read_text())["theme"] == "phosphor"
    assert AppSettings.load().theme == "phosphor"


def test_broken_settings_fall_back_to_defaults(tui_config_dir: Path) -> None:
    tui_config_dir.mkdir(parents=True)
    (tui_config_dir / "settings.json").write_text("{not json")
    settings = AppSettings.load()
    assert settings.theme == "kvscope-dark"
    assert settings.problem
    assert "not valid JSON" in settings.problem
    (tui_config_dir / "settings.json").write_text(json.dumps({"theme": 3, "cursor_blink": False}))
    settings = AppSettings.load()
    assert settings.theme == "kvscope-dark"
    assert settings.cursor_blink is False


def test_config_dir_env_var_wins(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "elsewhere"))
    assert config_dir() == tmp_path / "elsewhere"


def test_themes_one_light_at_least_and_distinct_names() -> None:
    themes = all_themes()
    assert len(themes) >= 3
    assert len({t.name for t in themes}) == len(themes)
    assert any(not t.dark for t in themes)
