"""KvscopeApp: the Textual app, and `run_tui`, the CLI's way to run it."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, ClassVar

import platformdirs
from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType

from engine.paths import open_private, private_dir, write_private
from engine.replay import ReplayEngine
from themes import all_themes
from tui.gc_pauses import GcPolicy
from tui.plotting import PlotRenderer
from tui.screens.help import HelpScreen
from tui.screens.main import MainScreen
from tui.screens.replay import ReplayScreen
from tui.settings import DEFAULT_THEME, AppSettings
from tui.telemetry.buffers import Telemetry
from tui.widgets import STYLESHEETS

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from textual.screen import Screen
    from textual.theme import Theme

    from engine.protocol import Engine

HERE = Path(__file__).parent


class KvscopeApp(App[int]):
    """kvscope's terminal UI around one engine.

    Everything is injected: the engine (real or fake) and the settings. Nothing is built
    at import time; the engine is started by the main screen, in a thread worker.

    Args:
        engine: What to drive, through its `Engine` protocol; a ReplayEngine gets the
            replay screen.
        settings: Remembered choices; read from the user's config folder when None.
        script: A start-up script, run as a worker once the app is mounted (the CLI's
            scripted demo is one); it drives the app as a user would.
    """

    TITLE = "kvscope"
    # The main screen's stylesheet is listed here: Textual loads a screen's own CSS_PATH
    # when it is pushed, but not for the app's default screen.
    CSS_PATH: ClassVar[list[str | PurePath]] = [
        HERE / "app.tcss",
        *STYLESHEETS,
        HERE / "screens" / "main.tcss",
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f1,question_mark", "help", "Help"),
        Binding("f5", "sweep", "Sweep"),
    ]

    def __init__(
        self,
        engine: Engine,
        settings: AppSettings | None = None,
        *,
        script: Callable[[KvscopeApp], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.settings = settings if settings is not None else AppSettings.load()
        self.script = script
        self.screenshot_path: str | None = None
        self.telemetry = Telemetry()
        self.renderer = PlotRenderer()
        blink = self.settings.cursor_blink
        # A tape plays into the same panels, on a screen that takes no input. The engine's
        # own type says so: `kvscope replay` hands the app the ReplayEngine itself.
        self._main = (
            ReplayScreen(engine, self.telemetry, self.renderer, cursor_blink=blink)
            if isinstance(engine, ReplayEngine)
            else MainScreen(engine, self.telemetry, self.renderer, cursor_blink=blink)
        )
        self._shown_theme = DEFAULT_THEME
        self.quitting = False
        """Ctrl+Q was pressed: the engine is being shut down, then the app exits."""
        self.screenshot_folder: Path | None = None
        """Where Ctrl+P → Screenshot saves; None: the working folder, else the data folder."""

    @property
    def manage_gc(self) -> bool:
        """Keep full GC collections out of the token stream (see tui/gc_pauses.py).

        Process-wide, so off unless the app owns the process (run_tui turns it on).
        """
        return self._main.gc_policy is not None

    @manage_gc.setter
    def manage_gc(self, on: bool) -> None:
        self._main.gc_policy = GcPolicy() if on else None

    @property
    def main_screen(self) -> MainScreen:
        return self._main

    def get_default_screen(self) -> Screen[None]:
        return self._main

    def on_mount(self) -> None:
        for theme in all_themes():
            self.register_theme(theme)
        wanted = self.settings.theme
        if wanted in self.available_themes:
            self.theme = wanted
            self._shown_theme = wanted
        else:
            # The saved name stays in the file: a fallback is not a choice the user made.
            self._shown_theme = DEFAULT_THEME
            self.theme = DEFAULT_THEME
            self.notify(
                f"The saved theme {wanted!r} is not available; using {DEFAULT_THEME}.",
                title="Theme",
                severity="warning",
            )
        # The palette offers kvscope's themes only (three, docs/playground.md): Textual's own are
        # not tuned for the block map's colours. Textual keeps "textual-ansi" for
        # terminals limited to ANSI colours.
        ours = {t.name for t in all_themes()}
        for name in list(self.available_themes):
            if name not in ours and name != "textual-ansi":
                self.unregister_theme(name)
        if self.settings.problem:
            self.notify(self.settings.problem, title="Settings", severity="warning")
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        if self.script is not None:
            self.run_worker(self.script(self), group="script", exit_on_error=False)

    def _remember_theme(self, theme: Theme) -> None:
        # Only a change away from the theme on screen is the user's choice; the signal
        # for the start-up (or fallback) theme itself may arrive after subscribing.
        if theme.name == self._shown_theme:
            return
        self._shown_theme = theme.name
        if theme.name == self.settings.theme:
            return
        self.settings.theme = theme.name
        try:
            # Only the key that changed: the rest of the file is left as the user wrote it.
            self.settings.save(only=("theme",))
        except OSError as exc:
            self.notify(
                f"Could not save the theme choice to {self.settings.path}: {exc.strerror or exc}",
                severity="warning",
            )

    # -- quitting --------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """Say "shutting down the engine…" while it stops, then exit; again: exit now."""
        if self.quitting:
            self.exit()
            return
        self.quitting = True
        from tui.screens.shutdown import ShuttingDownScreen

        # Stop the replies first, on the loop: their streams abort their requests.
        self._main.workers.cancel_group(self._main, "requests")
        await self.push_screen(ShuttingDownScreen())
        self._shut_down_engine()

    @work(thread=True, group="shutdown", exit_on_error=False)
    def _shut_down_engine(self) -> None:
        # In a thread: the real engine's shutdown joins its step thread, which can take
        # seconds; the loop keeps drawing the notice meanwhile. Idempotent, so the CLI's
        # own shutdown afterwards returns at once.
        try:
            self.engine.shutdown()
        finally:
            self.call_from_thread(self.exit)

    # -- screenshots -------------------------------------------------------------------------
    def deliver_screenshot(
        self,
        filename: str | None = None,
        path: str | None = None,
        time_format: str | None = None,
    ) -> str | None:
        """Save into kvscope's screenshots folder (or the working folder if that is not
        writable), never into a ~/Downloads that may not exist; the toast says where."""
        if path is None:
            folder = screenshot_folder(self.screenshot_folder)
            if folder is None:
                self.notify(
                    "Could not save a screenshot: neither "
                    f"{Path(platformdirs.user_data_dir('kvscope')) / 'screenshots'} nor the "
                    "working folder can be written.",
                    title="Screenshot",
                    severity="error",
                )
                return None
            path = str(folder)
        if not filename:
            filename = _svg_name(self.title, time_format)
        # The screen shows prompts and replies: the file is made 0600 before Textual's
        # delivery thread writes into it (it truncates, keeping the mode).
        try:
            os.close(open_private(Path(path) / filename, os.O_WRONLY | os.O_CREAT))
        except OSError as exc:
            self.notify(
                f"Could not save a screenshot in {path}: {exc.strerror or exc}",
                title="Screenshot",
                severity="error",
            )
            return None
        return super().deliver_screenshot(filename, path, time_format)

    def save_screenshot(
        self,
        filename: str | None = None,
        path: str | None = None,
        time_format: str | None = None,
    ) -> str:
        """Textual's, but the SVG is written 0600 (it shows prompts and replies)."""
        if not filename:
            filename = _svg_name(self.title, time_format)
        target = Path(os.path.expanduser(os.path.join(path or "./", filename)))
        write_private(target, self.export_screenshot())
        return str(target)

    # -- actions and commands --------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_sweep(self) -> None:
        from tui.sweep.screen import SweepScreen

        if not isinstance(self.screen, SweepScreen):
            self.push_screen(
                SweepScreen(
                    self.engine,
                    self.renderer,
                    host=self.telemetry.host,
                    cursor_blink=self.settings.cursor_blink,
                )
            )

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        main = self._main
        yield SystemCommand("Help", "Keys and what each panel shows", self.action_help)
        if isinstance(main, ReplayScreen):
            # A replay sends nothing: no sweep, and the tape decides when a chat starts.
            yield SystemCommand(
                "Play / pause", "Play or pause the replay", main.action_toggle_pause
            )
        else:
            yield SystemCommand(
                "Prompt-length sweep",
                "Measure TTFT and ITL over prompt lengths; export JSON or CSV",
                self.action_sweep,
            )
            yield SystemCommand(
                "New chat", "Clear the transcript and history", main.action_new_chat
            )
        yield SystemCommand(
            "Latency colours", "Colour every token by its latency", main.action_toggle_latency
        )
        yield SystemCommand(
            "Request timeline (F6)",
            "Switch the ITL plot and the timeline of every request's steps",
            main.action_toggle_timeline,
        )
        if main.engine_state in ("failed", "dead"):
            yield SystemCommand(
                "Restart engine", "Start the engine again", main.action_restart_engine
            )


def _svg_name(title: str, time_format: str | None) -> str:
    """A screenshot's name as Textual makes it: the title and the time."""
    stamp = datetime.now().strftime(time_format or "%Y-%m-%dT%H_%M_%S_%f")
    return f"{title.lower().replace(' ', '_')}_{stamp}.svg"


def screenshot_folder(preferred: Path | None = None) -> Path | None:
    """The first writable of: `preferred`, kvscope's own screenshots folder, the working
    folder. Not the working folder first: in a clone of kvscope that is the repository."""
    candidates = [preferred] if preferred is not None else []
    candidates += [Path(platformdirs.user_data_dir("kvscope")) / "screenshots", Path.cwd()]
    for folder in candidates:
        try:
            private_dir(folder)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    return None


def run_tui(
    engine: Engine,
    *,
    script: Callable[[KvscopeApp], Awaitable[None]] | None = None,
    screenshot: str | None = None,
    size: tuple[int, int] = (160, 48),
) -> int:
    """Run the app until the user quits; returns the process exit code.

    With `screenshot`, run headless at `size` instead, with `script` driving the app; the
    script saves an SVG to `app.screenshot_path` and exits. The engine belongs to the
    caller, which shuts it down; Ctrl+Q shuts it down first, inside the app, so that the
    user sees "shutting down the engine…" instead of a blank terminal (shutdown is
    idempotent: the caller's own call then returns at once).
    """
    app = KvscopeApp(engine, script=script)
    app.screenshot_path = screenshot
    app.manage_gc = True
    result = app.run(headless=True, size=size) if screenshot is not None else app.run()
    if app.return_code not in (None, 0):
        return app.return_code
    return result or 0
