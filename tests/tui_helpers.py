"""An app factory and small waiting helpers for kvscope's pilot tests and snapshots.

`make_app` builds the real app around a FakeEngine on virtual time, with the settings in a
temporary folder, the cursor not blinking and animations off, so that every run of a test
sees the same screens. The real-engine pilot test can pass its own engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.widgets import Input

from engine.clock import Clock, VirtualClock
from engine.events import RequestBlocks, StepSample
from engine.fake import FakeConfig, FakeEngine
from tui.app import KvscopeApp
from tui.settings import CONFIG_DIR_ENV, AppSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.app import App
    from textual.pilot import Pilot

    from engine.events import EmulationInfo, ModelCard, ProgressCallback
    from engine.protocol import Engine


WIDE = (160, 48)
"""A terminal size past the screens' 120-column breakpoint: the panels side by side."""
NARROW = (80, 24)
"""The classic terminal, under the breakpoint: the panels behind tabs."""


class HoldingClock(VirtualClock):
    """Virtual time that stops the fake's scheduler after `hold_after` steps.

    The fake sleeps on its clock after every step; here that sleep waits until `release()`
    once the step count is reached. Replies are then mid-stream for as long as a test
    needs, at an exact step, which neither a real clock nor a free-running virtual one gives.
    """

    def __init__(self, hold_after: int | None = None) -> None:
        super().__init__()
        self.steps = 0
        self.hold_after = hold_after
        self._gate: asyncio.Event | None = None

    @property
    def holding(self) -> bool:
        return self._gate is not None and not self._gate.is_set()

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        self.steps += 1
        if self.hold_after is not None and self.steps >= self.hold_after:
            self._gate = asyncio.Event()
            await self._gate.wait()

    def release(self) -> None:
        """Let the scheduler run freely from now on."""
        self.hold_after = None
        if self._gate is not None:
            self._gate.set()


class EmulatingFakeEngine(FakeEngine):
    """A FakeEngine whose card says its KV pool is sized as on a GPU (for the G wall)."""

    def __init__(
        self, emulation: EmulationInfo, config: FakeConfig | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(config, clock)
        self.emulation = emulation

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        card = dataclasses.replace(super().start(progress), emulation=self.emulation)
        self._card = card
        return card


def make_app(
    fake_config: FakeConfig | None = None,
    tmp_config_dir: Path | str | None = None,
    *,
    engine: Engine | None = None,
    clock: Clock | None = None,
    theme: str | None = None,
) -> KvscopeApp:
    """The app around `engine`, or around a FakeEngine(fake_config) on `clock`.

    Settings are read from `tmp_config_dir` (or `$KVSCOPE_CONFIG_DIR`, which conftest's
    autouse fixture points at a temporary folder), never from the user's real file.
    """
    folder = Path(tmp_config_dir) if tmp_config_dir is not None else None
    if folder is None and not os.environ.get(CONFIG_DIR_ENV):
        raise RuntimeError(f"tests must set {CONFIG_DIR_ENV} or pass tmp_config_dir")
    settings = AppSettings.load(folder)
    settings.cursor_blink = False
    if theme is not None:
        settings.theme = theme
    if engine is None:
        engine = FakeEngine(fake_config, clock=clock or VirtualClock())
    app = KvscopeApp(engine, settings)
    app.animation_level = "none"
    _log_notices(app)
    return app


NOTICES: weakref.WeakKeyDictionary[App[Any], list[tuple[str, str]]] = weakref.WeakKeyDictionary()
"""Every notice each app of make_app's raised, as (message, severity), expired or not."""


def _log_notices(app: KvscopeApp) -> None:
    """Keep each notice the app raises: Textual drops a notice from `app._notifications`
    once its timeout (5 s of the wall clock) has passed, so on a loaded host a notice raised
    as the app starts could be gone before a test first looks (fresh clone AB: a busy loop
    per core, the saved-theme notice never seen in 10 s)."""
    shown = NOTICES.setdefault(app, [])
    raise_notice = app.notify

    def notify(message: str, **kwargs: Any) -> None:
        shown.append((message, kwargs.get("severity", "information")))
        raise_notice(message, **kwargs)

    app.notify = notify  # type: ignore[method-assign]


async def wait_until(
    pilot: Pilot[Any],  # any app's: the repaint tests drive apps of their own
    condition: Callable[[], bool],
    timeout: float = 10.0,
    what: str = "",
    *,
    progress: Callable[[], object] | None = None,
) -> None:
    """Let the app run until `condition()` holds; fail the test after `timeout` seconds.

    With `progress` (a count that grows as the work goes on: tokens received, a replay's
    position), `timeout` is how long it may stand still: a loaded machine that is slower
    but moving is waited for, and one that is stuck fails as soon."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen = progress() if progress is not None else None
    while not condition():
        if progress is not None and (now := progress()) != seen:
            seen, deadline = now, loop.time() + timeout
        if loop.time() > deadline:
            still = f" (stuck at {seen!r} for {timeout:g} s)" if progress is not None else ""
            raise AssertionError(f"timed out waiting for {what or condition}{still}")
        await pilot.pause(0.01)


def screen_lines(app: App[Any], rows: int | None = None) -> list[str]:
    """The screen as the compositor draws it now, one string per row (trailing spaces cut):
    all rows, or the first `rows`."""
    return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()[:rows]]


async def notified(pilot: Pilot[int], text: str, *, severity: str | None = None) -> str:
    """Wait until the app has raised a notification containing `text`, and return its
    message: for make_app's apps, read from NOTICES (up, or expired since); for any other
    app, from those up now. A notice is a message the app posts to itself, so a fixed pause
    may come before it is handled on a loaded machine."""
    app = pilot.app

    def found() -> str | None:
        raised = [(n.message, n.severity) for n in app._notifications]
        for message, level in NOTICES.get(app, raised):
            if text in message and (severity is None or level == severity):
                return message
        return None

    await wait_until(pilot, lambda: found() is not None, what=f"a notification with {text!r}")
    message = found()
    assert message is not None
    return message


async def engine_ready(pilot: Pilot[int], timeout: float = 30.0, *, quiet: bool = True) -> None:
    """The engine started and the screen settled (`quiet`: see `settle`)."""
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    await wait_until(pilot, lambda: main.engine_state != "loading", timeout, "the engine to start")
    await settle(pilot, quiet=quiet)


async def settle(pilot: Pilot[int], rounds: int = 40, *, quiet: bool = True) -> None:
    """Wait for the screen to take in everything and redraw it (plots included), then until
    the app is quiet: no worker of its own still starting, and the screen the same after
    one more round of messages, layout, scrolls and a redraw. A snapshot or an assertion
    after this sees the app's state, not how far a loaded machine got with it. Fails, with
    the rows that kept changing, when the screen does not come to rest. `quiet=False` for a
    screen that is meant to move (a replay on the real clock): one round only."""
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    before: list[str] = []
    now: list[str] = []
    for _ in range(rounds if quiet else 1):
        await pilot.pause()
        await app.main_screen.redraw()
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        if not quiet:
            return
        if any(w.state.name == "PENDING" for w in app.workers):
            continue
        # Its text: where every row sits is what a late layout or scroll changes. Read off
        # the compositor, not an SVG screenshot: the SVG export was a fifth of a UI test.
        before, now = now, screen_lines(app)
        if now == before:
            return
    changed = difflib.unified_diff(before, now, "a round before", "the last", lineterm="", n=1)
    raise AssertionError(f"the screen kept changing over {rounds} rounds:\n" + "\n".join(changed))


async def reply_done(pilot: Pilot[int], timeout: float = 10.0, *, quiet: bool = True) -> None:
    """The reply finished and the screen settled (`quiet`: see `settle`)."""
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    await wait_until(pilot, lambda: not main.busy, timeout, "the reply to finish")
    await app.workers.wait_for_complete()
    await settle(pilot, quiet=quiet)


async def palette_open(pilot: Pilot[int], placeholder: str = "Search for commands…") -> None:
    """Until Textual's command palette with this placeholder is on screen and takes what
    is typed: keys pressed before it has focus would reach the screen beneath."""
    from textual.command import CommandInput, CommandPalette

    def open_() -> bool:
        palette = pilot.app.screen
        if not isinstance(palette, CommandPalette):
            return False
        search = palette.query_one(CommandInput)
        return search.placeholder == placeholder and pilot.app.focused is search

    await wait_until(pilot, open_, what=f"the command palette ({placeholder})")


async def palette_offers(pilot: Pilot[int], command: str) -> None:
    """Until the command palette's search for what was typed is in and `command` is the
    highlighted hit: what Enter runs."""
    from textual.command import Command, CommandList, CommandPalette

    def offered() -> bool:
        palette = pilot.app.screen
        if not isinstance(palette, CommandPalette):
            return False
        option = palette.query_one(CommandList).highlighted_option
        return isinstance(option, Command) and option.hit.text == command

    await wait_until(pilot, offered, what=f"the command palette to offer {command!r}")


async def send_chat(pilot: Pilot[int], text: str) -> None:
    """Type `text` in the message box and press Enter, as a user would."""
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    app.main_screen.chat.input.focus()
    await pilot.pause()
    app.main_screen.chat.input.value = text
    await pilot.press("enter")


SERIES_CONFIG = FakeConfig(max_model_len=8192, block_size=16, total_blocks=1024)
"""A fake big enough for the article's 512-4,096 series: 8,192 context, 16,384-token pool."""
SERIES_LENGTHS = (512, 1024, 2048, 4096)


async def send_series(
    pilot: Pilot[int], lengths: tuple[int, ...] = SERIES_LENGTHS, max_tokens: int = 32
) -> None:
    """Send one synthetic prompt of each length with Enter, as a presenter would."""
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    main = app.main_screen
    main.controls.query_one("#max-tokens", Input).value = str(max_tokens)
    main.controls.synthetic = True
    for n in lengths:
        main.controls.slider.value = n
        await pilot.pause()
        main.chat.input.focus()
        await pilot.press("enter")
        await reply_done(pilot)


def step_sample(
    step: int = 1,
    *,
    started_at: float = 1.0,
    blocks: tuple[RequestBlocks, ...] = (),
    free: int = 90,
    total: int = 90,
    block_size: int = 128,
    prefill: int = 0,
    decode: int = 0,
    running: int = 0,
    waiting: int = 0,
    duration: float = 0.1,
    preempted: tuple[str, ...] = (),
) -> StepSample:
    """One engine step as a test needs it: an idle 90-block pool unless told otherwise."""
    return StepSample(
        step=step,
        started_at=started_at,
        duration_s=duration,
        prefill_tokens=prefill,
        decode_tokens=decode,
        running=running,
        waiting=waiting,
        kv_usage=1 - free / total,
        free_blocks=free,
        total_blocks=total,
        block_size=block_size,
        blocks=blocks,
        preemptions=len(preempted),
        preempted_ids=preempted,
    )


def block_sample(blocks: tuple[RequestBlocks, ...], total: int = 64) -> StepSample:
    """A step sample holding `blocks` of a pool of `total`, for the block map's tests."""
    used = sum(len(b.block_ids) for b in blocks)
    return StepSample(
        step=1,
        started_at=0.0,
        duration_s=0.01,
        prefill_tokens=0,
        decode_tokens=len(blocks),
        running=len(blocks),
        waiting=0,
        kv_usage=used / total,
        free_blocks=total - used,
        total_blocks=total,
        block_size=16,
        blocks=blocks,
    )
