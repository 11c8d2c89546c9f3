"""A replay says what the tape says (#31 item 13): the controls show the replayed send's
settings, read-only (or say they are not the tape's); the footer offers no key that
would change them; the bar names both the tape's record and the engine's step, and
`--at` says which it takes; `--svg` never says "saved" after an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_tui_replay import POOL, playing, replay_app, shown
from tui_helpers import WIDE, screen_lines

from cli.main import main
from engine.tape import Tape, read_tape
from tui.widgets.count_stepper import CountStepper

if TYPE_CHECKING:
    from tui.app import KvscopeApp

README = Path(__file__).resolve().parents[1] / "README.md"
AT = 300
"""A step of the 8-copy send (r2: 512 synthetic tokens, 384 out, 8 copies)."""


@pytest.fixture(scope="module")
def pool() -> Tape:
    return read_tape(POOL)


def footer_keys(app: KvscopeApp) -> set[str]:
    """The actions the footer offers now (what Textual shows: enabled and shown)."""
    return {
        b.binding.action
        for b in app.screen.active_bindings.values()
        if b.binding.show and b.enabled
    }


async def test_the_controls_show_the_replayed_send_read_only(pool: Tape) -> None:
    send = next(r for r in pool.requests if r.request_id == "r2")
    max_tokens = send.request.sampling.max_tokens
    assert max_tokens != 128  # the panel's own default: a panel left alone would pass
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        controls = main.controls
        # Before the tape's first send: nothing in the panel is the tape's, and it says so.
        assert "not the tape's" in controls.replay_words
        main.replay.seek(AT)
        await shown(pilot)
        assert controls.concurrency == 8
        assert controls.synthetic and controls.prompt_tokens == 512
        assert controls.max_tokens == max_tokens
        assert "r2" in controls.replay_words and "from the tape" in controls.replay_words
        # Read-only: nothing in the panel takes a key or a click, the send button is gone.
        assert controls.query_one("#concurrency", CountStepper).disabled
        assert controls.slider.disabled
        assert not controls.query_one("#send-synthetic").display
        # Keys that would change the controls are off the footer and do nothing.
        offered = footer_keys(app)
        for action in ("toggle_synthetic", "prompt_length(2)", "prompt_length(-2)"):
            assert action not in offered, action
        assert not any(a.startswith("load_users") for a in offered)
        await pilot.press("f7", "ctrl+up", "ctrl+t")
        await pilot.pause()
        assert controls.synthetic and controls.prompt_tokens == 512
        assert controls.query_one("#load-users", CountStepper).value == 0
        # A rewind to the start: the chat's first send is plain chat, one copy.
        main.replay.seek(5)
        await shown(pilot)
        assert controls.concurrency == 1 and not controls.synthetic
        assert "r1" in controls.replay_words


async def test_the_bar_names_the_record_and_the_engine_step(pool: Tape) -> None:
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        main.replay.seek(AT)
        await shown(pilot)
        step = pool.steps[AT - 1].step
        assert step != AT  # the two numbers differ: the bar must say which is which
        assert main.bar.words.startswith(f"record {AT} / {len(pool.steps)} · engine step {step} · ")
        assert f"step {step}" in main.engine_panel.status_text()


def test_at_says_it_counts_the_bars_records(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--at RECORD" in out
    assert "not the engine's step number" in out


def test_svg_is_never_saved_after_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # The race of the bug report, made certain: sends the screen takes in after the
    # screenshot, while the app exits (a late rewind and the tape's sends again).
    import cli.replay as cli_replay

    real = cli_replay.replay_to

    async def late(app: KvscopeApp, at: int, timeout: float = 60.0) -> None:
        await real(app, at, timeout)
        replay = app.main_screen.replay  # type: ignore[attr-defined]
        replay.seek(0)
        replay.seek(at)

    monkeypatch.setattr(cli_replay, "replay_to", late)
    svg = tmp_path / "x.svg"
    code = main(["replay", str(POOL), "--svg", str(svg), "--at", "300", "--size", "80x24"])
    out, err = capfd.readouterr()
    assert "MountError" not in out + err
    assert code == 0 and out.startswith(f"saved {svg}")


def test_svg_says_the_error_and_not_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # An error inside the app right after the screenshot was taken: exit 1, no "saved".
    from tui.app import KvscopeApp
    from tui.screens.replay import ReplayScreen

    async def broken(self: ReplayScreen, message: object) -> None:
        raise RuntimeError("a handler broke")

    real = KvscopeApp.save_screenshot

    def then_break(self: KvscopeApp, *args: object, **kwargs: object) -> str:
        saved = real(self, *args, **kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(ReplayScreen, "on_replay_rewound_to", broken)
        self.main_screen.replay.seek(0)  # type: ignore[attr-defined]
        return saved

    monkeypatch.setattr(KvscopeApp, "save_screenshot", then_break)
    svg = tmp_path / "x.svg"
    code = main(["replay", str(POOL), "--svg", str(svg), "--at", "300", "--size", "80x24"])
    out, err = capfd.readouterr()
    assert code == 1
    assert "saved" not in out
    assert "a handler broke" in err


async def test_the_replayed_preemption_note_is_whole_at_160x48(pool: Tape) -> None:
    from rich.console import Console
    from rich.text import Text
    from textual.widgets import Static

    first = next(i for i, s in enumerate(pool.steps) if s.preemptions)
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        note = main.engine_panel.query_one("#preempt-note", Static)
        # From the preemption on, as the recomputation's cost becomes known: each note
        # must fit its box (at the end of this tape a cut one lost "(4,226 ms)."), at 58 columns.
        for position in (first + 1, len(pool.steps)):
            main.replay.seek(position)
            await shown(pilot)
            words = main.engine_panel.preemption_text()
            assert words
            width = note.content_size.width
            lines = Text(words).wrap(Console(width=width), width)
            assert note.content_size.height >= len(lines), (position, words)


# -- #31 item 15: an emulated GPU whose pool is the pool itself --------------------------


async def test_an_emulated_pool_that_is_the_pool_says_g_equals_k() -> None:
    import dataclasses

    from test_tui_widgets import CARD, Host

    from engine.events import EmulationInfo
    from tui.widgets.prompt_length_slider import PromptLengthSlider, consequences, walls_for

    # --emulate-gpu l4 at full scale: the pool here IS the L4's, so G would sit on K.
    pool = CARD.total_blocks * CARD.block_size
    card = dataclasses.replace(
        CARD, emulation=EmulationInfo("L4", "qwen2.5-7b", pool_tokens=pool, kv_bytes_per_token=1)
    )
    for copies in (1, 4):
        walls = walls_for(card, copies, 128)
        assert [w.kind for w in walls].count("gpu") == 0, copies  # one wall, not two
        k = next(w for w in walls if w.kind == "kv_pool")
        assert consequences([k]) == [
            "past the KV pool here and on a real L4: requests will be preempted/queued"
        ]
    slider = PromptLengthSlider(value=1600)
    async with Host(slider).run_test(size=(60, 16)) as pilot:
        slider.card = card
        await pilot.pause()
        text = str(slider.render())
        assert "G = K (the pool is sized as the L4's)" in text
        assert "G L4 KV pool" not in text
    # --emulate-scale 0.5: the pool is half the L4's, and the line says so.
    assert card.emulation is not None
    half = dataclasses.replace(card, emulation=dataclasses.replace(card.emulation, scale=0.5))
    k = next(w for w in walls_for(half, 1) if w.kind == "kv_pool")
    assert k.note == "G = K (the pool is sized as 50% of the L4's)"


async def test_the_preemption_recipe_preempts_in_under_two_minutes() -> None:
    # The help's and the README's recipe, key by key, on the engine `kvscope --fake`
    # runs (FakeConfig's defaults), on virtual time: the first preemption comes well
    # inside the two minutes a presenter has.
    from tui_helpers import engine_ready, make_app, wait_until

    from engine.clock import VirtualClock
    from engine.fake import FakeConfig, FakeEngine
    from tui.screens.help import PANELS_TEXT, PREEMPTION_RECIPE_KEYS

    readme = README.read_text()
    words = " ".join(PANELS_TEXT.split())
    for text in (words, " ".join(readme.split())):
        assert "kvscope --fake" in text and "preempt" in text
        for keys in PREEMPTION_RECIPE_KEYS:
            assert keys in text, keys
    clock = VirtualClock()
    app = make_app(engine=FakeEngine(FakeConfig(prefix_caching=True), clock=clock))
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        start = clock.now()
        await pilot.press("f7", "f4", "tab", *["right"] * 7, "f2", "enter")
        await wait_until(
            pilot,
            lambda: bool(main.engine_panel.preemption_text()),
            timeout=60,
            what="a preemption",
        )
        assert main.controls.concurrency == 8 and main.controls.synthetic
        assert clock.now() - start < 120


# -- #31 item 16: small words ------------------------------------------------------------


def test_the_load_line_counts_users_and_never_runs_past_its_point() -> None:
    from test_tui_live_load import _point

    from tui.live_load import POINT_S, LiveLoad, point_words

    load = LiveLoad(users=1)
    load.started_point(1, 100.0)
    assert load.words(103.0) == f"1 user: point running, 3 of {POINT_S:.0f} s"
    # Past its 10 s the point waits for its last replies: said, not "15 of 10 s".
    late = load.words(100.0 + POINT_S + 5)
    assert f"{POINT_S + 5:.0f} of" not in late
    assert late.startswith("1 user: finishing the point")
    assert point_words(_point(1, 40.0, 25.0)).startswith("1 user ")
    assert point_words(_point(8, 40.0, 25.0)).startswith("8 users ")


async def test_max_tokens_0_is_refused_in_a_line() -> None:
    from textual.widgets import Input
    from tui_helpers import engine_ready, make_app

    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await engine_ready(pilot)
        main = app.main_screen
        main.controls.query_one("#max-tokens", Input).value = "0"
        await pilot.pause()
        assert not await main.send("hello")
        assert main.chat.replies() == []
        assert "✗ Not sent. max tokens is 0: give at least 1" in main.chat.transcript_text()


async def test_the_load_sweep_bar_starts_afresh_after_a_run() -> None:
    from test_tui_sweep_load import CONFIG, _load_mode, _run_to_end
    from textual.widgets import ProgressBar
    from tui_helpers import make_app

    app = make_app(CONFIG)
    async with app.run_test(size=WIDE) as pilot:
        screen = await _load_mode(pilot, load_levels="1")
        await _run_to_end(pilot, screen)
        bar = screen.query_one(ProgressBar)
        assert bar.percentage == 1.0
        # Another mode (or back): nothing runs, so no bar may still say 100%.
        await pilot.press("f4")
        await pilot.pause()
        assert not bar.percentage
        await pilot.press("f4")
        await pilot.pause()
        assert not bar.percentage


SWEEP = POOL.parent / "sweep-512-4096.jsonl"


async def test_the_sweep_tapes_synthetic_replies_are_folded_not_system_system() -> None:
    # The shipped sweep tape's requests are token-ID prompts no user typed; their
    # replies are what a small model says to random tokens ("system system …"). Shown
    # as a live synthetic send is: folded, with the count.
    tape = read_tape(SWEEP)
    app = replay_app(tape)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        main.replay.seek(200)  # the 2,048-token request streaming, as the bug's SVG
        await shown(pilot)
        screen_text = "\n".join(screen_lines(app))
        assert "system system" not in screen_text
        assert "tokens of synthetic output, folded" in screen_text
        replies = main.chat.replies()
        assert replies and all(r.synthetic for r in replies)


async def test_a_replayed_reply_does_not_offer_esc(pool: Tape) -> None:
    """Esc stops a live reply; a replayed one cannot be stopped, so its footer does not
    say "Esc stops" (it did, while the tape's reply streamed)."""
    app = replay_app(pool)
    async with app.run_test(size=WIDE) as pilot:
        main = await playing(pilot)
        main.replay.seek(AT)
        await shown(pilot)
        text = "\n".join(screen_lines(app))
        assert "streaming · " in text  # r2's copies are mid-reply at this record
        assert "Esc stops" not in text
