"""ReplayScreen: the playground on a ReplayEngine.

The recorded session plays into the same panels as a live one: every send of the tape
becomes a user message and a streamed reply (through MainScreen's own `_stream`), every
step feeds the block map and the plots. A position bar says where the replay is; Space,
←/→ and Home/End pause and seek. Nothing can be sent: the message box gives way to a
line saying this is a replay.

The replay engine calls its listeners on this loop, in tape order. Each listener only
posts a message, so the screen takes sends, rewinds and steps in that same order; a seek
backwards bumps a generation number at once, and any send posted before it is dropped
when its turn comes (its streams belong to the tape as it was before the rewind).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Footer, Static

from engine.errors import KvscopeError
from engine.tape import ReplayOnly
from tui.messages import EngineReady
from tui.screens.main import MainScreen, send_labels
from tui.widgets.replay_bar import ReplayBar

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from textual.app import ComposeResult

    from engine.events import GenerationRequest
    from engine.replay import ReplayedSend, ReplayEngine, ReplayPosition
    from tui.plotting import PlotRenderer
    from tui.telemetry.buffers import Telemetry

SEEK = Binding.Group("Seek")


@dataclass
class ReplaySent(Message):
    """The tape reached a send; `generation` is the screen's at the time."""

    send: ReplayedSend
    generation: int


@dataclass
class ReplayRewoundTo(Message):
    """The replay went back: the screen forgets the session and it plays again."""

    position: int


@dataclass
class ReplayNewChat(Message):
    """The tape reached the user's Ctrl+N."""

    generation: int


def forget_session(telemetry: Telemetry) -> None:
    """Empty every buffer the panels draw from, as before the first step (a rewind)."""
    telemetry.clear_plots()
    telemetry.perf_agreement.clear(contexts=True)
    telemetry.requests.clear()
    telemetry.latest = None
    telemetry.t0 = None
    telemetry.itl_request = None
    telemetry.tokens.clear()
    telemetry.tracked_finish = None
    telemetry.cursor = None
    telemetry.itl_version += 1


def replay_note(tape_name: str, created: str) -> str:
    """The line in place of the message box; short enough for 80 columns."""
    when = f" · recorded {created[:16].replace('T', ' ')}" if created else ""
    return f"Replay of {tape_name}{when} · read-only"


class ReplayScreen(MainScreen):
    """MainScreen driven by a tape instead of the user: sends come from the replay."""

    DEFAULT_CSS = """
    ReplayScreen #replay-note {
        dock: bottom;
        height: auto;
        padding: 0 1;
        color: $text-secondary;
        background: $boost;
    }
    """
    # Priority: the focused widget (the slider, the ITL box) must not take these keys.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "toggle_pause", "Play/pause", priority=True),
        Binding("left", "seek_by(-1)", "Step back", key_display="←", priority=True, group=SEEK),
        Binding("right", "seek_by(1)", "Step on", key_display="→", priority=True, group=SEEK),
        Binding(
            "home", "seek_start", "To the start", key_display="Home", priority=True, group=SEEK
        ),
        Binding("end", "seek_end", "To the end", key_display="End", priority=True, group=SEEK),
        Binding("f5", "no_sweep", "Sweep (not in a replay)", show=False),
        # Still there, but off the footer: at 80 columns it has room for the replay's keys.
        Binding("ctrl+l", "toggle_latency", "Latency colours", show=False),
        Binding("f9", "clear_plots", "Clear plots", show=False),
    ]

    @classmethod
    def replay_bindings(cls) -> list[Binding]:
        """The keys a replay adds (for the help), without the ones it only hides."""
        return [b for b in cls.BINDINGS if isinstance(b, Binding) and b.show]

    def __init__(
        self,
        engine: ReplayEngine,
        telemetry: Telemetry,
        renderer: PlotRenderer,
        *,
        cursor_blink: bool = True,
    ) -> None:
        super().__init__(engine, telemetry, renderer, cursor_blink=cursor_blink)
        self.replay = engine
        source = engine.tape.path if engine.tape is not None else None
        self.tape_name = Path(source).name if source is not None else "a tape"
        self._generation = 0
        self._to_end: tuple[bool, float | None] | None = None  # End pressed: (paused, gap)
        self._removers: list[Callable[[], None]] = []
        self.sends_pending = 0
        """Sends the replay handed over that the screen has not taken in yet (`--svg`
        waits for none before it saves the screen)."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, Footer):
                yield ReplayBar(self.tape_name, id="replay-bar")
            yield widget

    def on_mount(self) -> None:
        # Runs before MainScreen.on_mount (Textual calls each class's handler, the
        # subclass's first): the message box is gone before anything could focus it.
        chat_input = self.chat.input
        chat_input.disabled = True
        chat_input.display = False
        self.chat.stoppable = False  # Esc does not stop a replayed reply: no footer says so
        tape = self.replay.tape
        note = Static(replay_note(self.tape_name, tape.created if tape else ""), id="replay-note")
        self.chat.mount(note)
        self.controls.make_read_only()
        self.call_after_refresh(self.bar.focus)
        replay = self.replay
        self._removers = [
            replay.add_send_listener(self._on_send),
            replay.add_rewind_listener(self._on_rewind),
            replay.add_new_chat_listener(self._on_new_chat),
            replay.add_position_listener(self._on_position),
        ]

    def on_unmount(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = []

    @property
    def bar(self) -> ReplayBar:
        return self.query_one(ReplayBar)

    # -- from the replay engine (on this loop, in tape order) ------------------------------
    def _on_send(self, send: ReplayedSend) -> None:
        self.sends_pending += 1
        self.post_message(ReplaySent(send, self._generation))

    def _on_rewind(self, position: int) -> None:
        # At once, not by message: sends already posted are of the tape before the rewind.
        self._generation += 1
        self.post_message(ReplayRewoundTo(position))

    def _on_new_chat(self) -> None:
        self.post_message(ReplayNewChat(self._generation))

    def _on_position(self, position: ReplayPosition) -> None:
        self.bar.position = position
        if position.ended:
            self._end_reached()

    def _end_reached(self) -> None:
        """Undo what End did to reach the very end (also when another key comes first)."""
        if self._to_end is None:
            return
        paused, gap = self._to_end
        self._to_end = None
        self.replay.max_gap_s = gap
        if paused:
            self.replay.pause()

    # -- playing ---------------------------------------------------------------------------
    @on(EngineReady)
    def _ready_to_play(self) -> None:
        # MainScreen's own handler (which registers the step listener) runs right after
        # this one: start playing only once it has.
        self.call_later(self._start_playing)

    def _start_playing(self) -> None:
        card = self.card
        if card is not None:
            self.sub_title = f"{card.name} · replay of {self.tape_name}"
            # The panel's host warning reads this machine's load average: about a
            # replay it would say nothing true. The recorded steps' spread still counts.
            self.telemetry.host.check_load = False
        self.bar.position = self.replay.snapshot()
        self._play()

    @work(group="replay", exclusive=True, exit_on_error=False)
    async def _play(self) -> None:
        try:
            await self.replay.run(hold_at_end=True)
        except KvscopeError as exc:
            self.notify(exc.plain(), title="Replay", severity="error")

    async def on_replay_sent(self, message: ReplaySent) -> None:
        try:
            # Not once the app is exiting (after `--svg` saved the screen): nothing can be
            # mounted then, and Textual would call it an error.
            if message.generation == self._generation and self.is_attached:
                await self._show_send(message.send)
        finally:
            self.sends_pending -= 1

    async def _show_send(self, send: ReplayedSend) -> None:
        """What `send()` shows for a user's Enter, for a send of the tape."""
        generation = self._generation
        message = send.message
        if not send.requests:
            if message is not None:  # sent, but nothing reached the engine
                await self.chat.add_user_message(message.text)
            return
        ids = [r.request_id for r in send.requests]
        first = send.requests[0]
        self.controls.show_tape_send(
            ids[0],
            synthetic_tokens=(
                message.synthetic_tokens
                if message is not None
                else (send.recorded[0].prompt_tokens if not first.messages else None)
            ),
            copies=len(ids),
            sampling=first.sampling,
        )
        if message is not None:
            text, synthetic = message.text, message.synthetic_tokens
            note, title = send_labels(ids, synthetic)
        else:
            # A request no user typed (a sweep, `generate --tape`): say what it was.
            text = lone_request_text(send.requests[0])
            prompt = send.recorded[0].prompt_tokens
            note = f"⟨request {ids[0]}" + (f": {prompt:,}-token prompt⟩" if prompt else "⟩")
            _, title = send_labels(ids, None)
            # A prompt of token IDs (a sweep's; the tape keeps only its length) is
            # synthetic: its reply is what a model says to random tokens ("system
            # system …"), folded as a live synthetic reply is.
            synthetic = prompt if prompt and not first.messages else None
        await self.chat.add_user_message(text, note)
        reply = await self.chat.add_reply(
            title, ids, self._status_of, synthetic=synthetic is not None
        )
        if generation != self._generation:
            return  # rewound meanwhile: the rewind's own handler clears this away
        self._current_user_text = text
        self._current_synthetic = synthetic is not None
        self.current = reply
        self.telemetry.track_request(ids[0])
        for copy, request in enumerate(send.requests):
            self.run_worker(
                self._stream(reply, copy, request), group="requests", exit_on_error=False
            )

    async def on_replay_rewound_to(self, message: ReplayRewoundTo) -> None:
        if not self.is_attached:
            return  # the app is exiting: there is nothing left to clear
        self.workers.cancel_group(self, "requests")
        self.current = None
        forget_session(self.telemetry)
        self.engine_panel.reset()
        self.conversation.clear()
        await self.chat.clear()
        self.controls.show_tape_send(None)

    async def on_replay_new_chat(self, message: ReplayNewChat) -> None:
        if message.generation == self._generation and self.is_attached:
            await self.action_new_chat()

    # -- what the user may do --------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("new_chat", "restart_engine", "stop"):
            return False  # the tape decides; a replay has nothing to restart or stop
        if action in ("toggle_synthetic", "prompt_length", "load_users"):
            return False  # the controls show the tape's send, read-only: off the footer
        return super().check_action(action, parameters)

    async def send(self, text: str, *, synthetic: bool | None = None) -> bool:
        self.notify(ReplayOnly("send a message").plain(), title="Replay", severity="warning")
        return False

    def action_toggle_pause(self) -> None:
        if self.engine_state != "ready":
            return
        self._end_reached()
        if self.replay.ended:
            self.replay.seek(0)  # Space at the end plays it again
            self.replay.resume()
            return
        self.replay.toggle_pause()

    def action_seek_by(self, steps: int) -> None:
        if self.engine_state == "ready":
            self._end_reached()
            self.replay.seek(self.replay.position + steps)

    def action_seek_start(self) -> None:
        if self.engine_state == "ready":
            self._end_reached()
            self.replay.seek(0)

    def action_seek_end(self) -> None:
        """To the end of the tape: its last step, and what was recorded after it."""
        replay = self.replay
        if self.engine_state != "ready":
            return
        self._end_reached()
        replay.seek(replay.length)
        if not replay.ended:
            # seek() stops at the last step, before the records that follow it (the last
            # reply's end, the end of the recording): play them now, with no gap. The
            # position listener puts pause and gap back once the end is reached.
            self._to_end = (replay.paused, replay.max_gap_s)
            replay.max_gap_s = 0.0
            replay.resume()

    def action_no_sweep(self) -> None:
        self.notify(ReplayOnly("run a sweep").plain(), title="Replay", severity="warning")


def lone_request_text(request: GenerationRequest) -> str:
    """The last user message of a request no user typed, or "" for a prompt of token IDs."""
    users: Sequence[str] = [m.content for m in request.messages if m.role == "user"]
    return users[-1] if users else ""
