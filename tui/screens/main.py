"""MainScreen: the three panels, the engine's life cycle, and sending requests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Header, Input, Static, Tab, Tabs

from engine.errors import EngineDied, EngineStartFailed, KvscopeError, PromptTooLong
from engine.events import (
    EngineState,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    RequestAccepted,
    RequestFinished,
    ScrapeSample,
    StepSample,
    StepStarted,
    TokenEvent,
)
from engine.request_book import prompt_fits
from tui import format as fmt
from tui.live_load import LiveLoad, live_config, load_ceiling
from tui.messages import (
    EngineFailed,
    EngineProgressed,
    EngineReady,
    ScrapeSampled,
    StepBegan,
    StepSampled,
)
from tui.screens.conversation import Conversation
from tui.screens.estimates import FloorFn, PrefillEstimate, estimate, roofline_floor
from tui.telemetry.perf_agreement import PerfAgreement, step_model_for
from tui.widgets.chat_pane import ChatPane
from tui.widgets.controls_panel import ControlsPanel
from tui.widgets.count_stepper import CountStepper
from tui.widgets.engine_panel import EnginePanel
from tui.widgets.latency_box import LatencyBox
from tui.widgets.model_card import ModelCardView
from tui.widgets.pruned_footer import PrunedFooter

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from engine.protocol import Engine
    from roofline.step_perf import StepModel
    from tui.gc_pauses import GcPolicy
    from tui.plotting import PlotRenderer
    from tui.telemetry.buffers import Telemetry
    from tui.telemetry.request_status import RequestStatus
    from tui.widgets.reply_block import ReplyBlock

REDRAW_HZ = 20  # the chat and the engine panel each redraw at half this
PANELS = ("chat", "engine", "controls")


def send_labels(ids: list[str], synthetic_tokens: int | None) -> tuple[str | None, str]:
    """The note over a sent message and its reply's title (live, replayed or resumed)."""
    copies = len(ids)
    times = f" × {copies} copies" if copies > 1 else ""
    if synthetic_tokens is not None:
        n = synthetic_tokens
        return (
            f"⟨synthetic prompt: {n:,} tokens{times}⟩",
            f"assistant · {ids[0]} · {n:,}-token prompt{times}",
        )
    return (f"⟨{copies} copies⟩" if copies > 1 else None), f"assistant · {ids[0]}{times}"


class MainScreen(Screen[None]):
    """Controls | Chat | Engine side by side when wide; one at a time, under tabs, when not."""

    # Styled by screens/main.tcss, which the app loads (see KvscopeApp.CSS_PATH).
    # Textual declares this without ClassVar, so it is assigned unannotated here.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop reply"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+l", "toggle_latency", "Latency colours"),
        Binding("ctrl+r", "restart_engine", "Restart engine"),
        Binding("f9", "clear_plots", "Clear plots"),
        # The presenter's walk up the slider without leaving the message box.
        Binding("f7", "toggle_synthetic", "Slider on/off"),
        Binding("ctrl+up", "prompt_length(2)", "Prompt ×2"),
        Binding("ctrl+down", "prompt_length(-2)", "Prompt ÷2"),
        Binding("ctrl+t", "load_users(2)", "Load ×2"),
        Binding("ctrl+o", "load_users(0)", "Load off", show=False),
        Binding("pageup", "scroll_panel(-1)", "Scroll up", show=False),
        Binding("pagedown", "scroll_panel(1)", "Scroll down", show=False),
        Binding("ctrl+y", "toggle_log_latency", "Latency plot: log y-axis", show=False),
        Binding("f6", "toggle_timeline", "ITL plot / request timeline", show=False),
        # Short in the footer, where every column counts; help says it in full (tooltip).
        Binding("f8", "toggle_roofline", "Roofline", tooltip="Roofline plot on/off"),
        Binding("f2", "show_panel('chat')", "Chat panel", show=False),
        Binding("f3", "show_panel('engine')", "Engine panel", show=False),
        Binding("f4", "show_panel('controls')", "Controls panel", show=False),
    ]

    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Where the engine is in its life (see `engine.events.EngineState`)."""
    card: reactive[ModelCard | None] = reactive(None)
    """The loaded model."""
    busy: reactive[bool] = reactive(False)
    """A reply (with all its copies) is streaming."""
    latency_colours: reactive[bool] = reactive(False)
    """Colour every token by its latency."""

    def __init__(
        self,
        engine: Engine,
        telemetry: Telemetry,
        renderer: PlotRenderer,
        *,
        cursor_blink: bool = True,
    ) -> None:
        super().__init__()
        self.cursor_blink = cursor_blink
        self.gc_policy: GcPolicy | None = None  # set by the app when it owns the process
        self.engine = engine
        self.telemetry = telemetry
        self.renderer = renderer
        self.conversation = Conversation()
        self.current: ReplyBlock | None = None
        self._current_user_text = ""
        self._current_synthetic = False
        self._remove_listener: object = None
        self._remove_scrape_listener: object = None
        self._remove_start_listener: object = None
        self.live_load = LiveLoad()
        """The playground's background traffic (the Load box), see tui/live_load.py."""
        self._load_running = False
        self._ticks = 0
        self._busy_notified = False  # one "still streaming" toast per reply, not one per Enter
        self._floor: FloorFn | None = None
        self._estimate_seen: object = None

    def compose(self) -> ComposeResult:
        # The breakpoint class the first Resize would set, set before the panels mount:
        # set after, it restyles every widget on the screen (tests/test_tui_start_restyles.py).
        width = self.app.size.width
        self.add_class(max(b for b in self.HORIZONTAL_BREAKPOINTS if width >= b[0])[1])
        yield Header()
        yield Tabs(
            Tab("Chat F2", id="tab-chat"),
            Tab("Engine F3", id="tab-engine"),
            Tab("Controls F4", id="tab-controls"),
            id="panel-tabs",
        )
        with Horizontal(id="panels"):
            yield ControlsPanel(id="controls", classes="panel").data_bind(
                MainScreen.card, MainScreen.engine_state
            )
            yield ChatPane(id="chat", classes="panel -active").data_bind(
                MainScreen.engine_state, MainScreen.busy, MainScreen.latency_colours
            )
            # Not ready from the start (loading), rather than a restyle of the panel's
            # every widget at its mount; the state's watcher keeps it from there.
            ready = "" if self.engine_state == "ready" else " -not-ready"
            yield EnginePanel(self.telemetry, id="engine", classes="panel" + ready).data_bind(
                MainScreen.engine_state, MainScreen.card
            )
        yield PrunedFooter()

    def on_mount(self) -> None:
        for field in self.query(Input):
            field.cursor_blink = self.cursor_blink
        self.set_interval(1 / REDRAW_HZ, self._tick)
        self.watch(self.controls, "synthetic_tokens", self._synthetic_changed)
        self.chat.input.focus()
        card = self.engine.card
        self.engine_panel.live_load = self.live_load
        if card is not None:
            # Already running (a test's shared engine, say): restarting would only cost time.
            self.post_message(EngineReady(card))
        else:
            self.start_engine()

    def on_unmount(self) -> None:
        if callable(self._remove_listener):
            self._remove_listener()
        if callable(self._remove_scrape_listener):
            self._remove_scrape_listener()
        if callable(self._remove_start_listener):
            self._remove_start_listener()
        if self.gc_policy is not None:
            self.gc_policy.stopped()

    # -- parts -----------------------------------------------------------------------------
    @property
    def chat(self) -> ChatPane:
        return self.query_one(ChatPane)

    @property
    def controls(self) -> ControlsPanel:
        return self.query_one(ControlsPanel)

    @property
    def engine_panel(self) -> EnginePanel:
        return self.query_one(EnginePanel)

    # -- the engine's life cycle -----------------------------------------------------------
    def start_engine(self) -> None:
        self.engine_state = "loading"
        self.chat.status.progress = None
        self._start_engine()

    @work(thread=True, group="engine", exclusive=True, exit_on_error=False)
    def _start_engine(self) -> None:
        # Runs in a thread: `start` blocks for as long as loading takes. From here the
        # screen is only told things by message.
        def progress(stage: LoadProgress) -> None:
            self.post_message(EngineProgressed(stage))

        try:
            card = self.engine.start(progress)
        except KvscopeError as exc:
            self.post_message(EngineFailed(exc))
        except Exception as exc:  # anything untyped still reaches the user in words
            self.post_message(EngineFailed(EngineStartFailed(f"{type(exc).__name__}: {exc}")))
        else:
            self.post_message(EngineReady(card))

    def _on_step(self, sample: StepSample) -> None:
        # Called from the engine's step thread (or the loop, for the fake).
        # A RuntimeError means the app's loop is already closed: nobody is watching.
        with contextlib.suppress(RuntimeError):
            self.post_message(StepSampled(sample))

    def _on_step_start(self, started: StepStarted) -> None:
        # From the step thread, before the model runs: a long prefill shows as running.
        with contextlib.suppress(RuntimeError):
            self.post_message(StepBegan(started))

    def on_step_began(self, message: StepBegan) -> None:
        self.telemetry.step_started(message.started)

    def _on_scrape(self, sample: ScrapeSample) -> None:
        # Called from a remote engine's scraper thread.
        with contextlib.suppress(RuntimeError):
            self.post_message(ScrapeSampled(sample))

    def on_scrape_sampled(self, message: ScrapeSampled) -> None:
        view = self.engine_panel.remote_state
        view.sample = message.sample
        remote = self.engine.features.remote
        view.capabilities = remote.capabilities if remote is not None else None
        view.cache = remote.prefix_cache() if remote is not None else None

    def on_engine_progressed(self, message: EngineProgressed) -> None:
        self.chat.status.progress = message.progress

    def _synthetic_changed(self, tokens: int | None) -> None:
        self.chat.synthetic_tokens = tokens
        self._update_estimate()

    def send_estimate(self) -> PrefillEstimate | None:
        """How long the next synthetic send will take to prefill, if that can be told."""
        card = self.card
        tokens = self.controls.synthetic_tokens
        if card is None or tokens is None:
            return None
        return estimate(
            card,
            tokens,
            self.controls.concurrency,
            measured=self.telemetry.prefill_steps(),
            floor=self._floor,
        )

    def _update_estimate(self) -> None:
        guess = self.send_estimate()
        self.controls.estimate_text = (
            # Words, not ⏱: the SVG font has no such glyph and draws a box.
            f"Estimate: {guess.words()}" if guess is not None and guess.long else ""
        )

    @work(thread=True, group="roofline", exclusive=True, exit_on_error=False)
    def _load_floor(self, card: ModelCard) -> None:
        # Reads the model's config and the cached CPU calibration: off the loop.
        floor = roofline_floor(card)
        self.app.call_from_thread(self._floor_loaded, floor)

    def _floor_loaded(self, floor: FloorFn | None) -> None:
        self._floor = floor
        self._update_estimate()

    @work(thread=True, group="step-model", exclusive=True, exit_on_error=False)
    def _load_step_model(self, card: ModelCard, remote: bool) -> None:
        # Reads the model's config.json: off the loop. The model is handed over whole, to
        # be fed on the loop only (one owner: the telemetry).
        model, missing = step_model_for(card, remote=remote)
        self.app.call_from_thread(self._step_model_loaded, card, model, missing)

    def _step_model_loaded(self, card: ModelCard, model: StepModel | None, missing: str) -> None:
        if card is self.card:  # not an engine restarted since
            self.telemetry.perf_agreement = PerfAgreement(model, missing)

    def on_engine_ready(self, message: EngineReady) -> None:
        if self._remove_listener is None:
            self._remove_listener = self.engine.add_step_listener(self._on_step)
        features = self.engine.features
        self.query_one(ModelCardView).memory = features.memory
        starts = features.step_starts
        if starts is not None and self._remove_start_listener is None:
            self._remove_start_listener = starts.add_step_start_listener(self._on_step_start)
        # The engine says whether its samples are its own steps: the timeline and the
        # explainer need not guess it from the first samples.
        self.telemetry.timeline.per_request = features.exact_steps
        remote = features.remote
        if remote is not None and self._remove_scrape_listener is None:
            self._remove_scrape_listener = remote.add_scrape_listener(self._on_scrape)
        self.engine_panel.remote = remote is not None
        self.engine_panel.fleet = features.fleet
        if remote is not None:
            self.engine_panel.remote_state.capabilities = remote.capabilities
        if self.gc_policy is not None:
            self.gc_policy.started()
        self.card = message.card
        self.engine_state = "ready"
        self.sub_title = message.card.name
        self.refresh_bindings()
        self._load_floor(message.card)
        self._load_step_model(message.card, remote is not None)

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.chat.status.error_text = message.error.plain()
        self.engine_state = "failed"
        self.sub_title = "engine not running"
        self.refresh_bindings()

    def on_step_sampled(self, message: StepSampled) -> None:
        self.telemetry.add_sample(message.sample)

    def _engine_died(self, error: KvscopeError) -> None:
        if self.engine_state == "dead":
            return
        self.chat.status.error_text = error.plain()
        self.engine_state = "dead"
        self.sub_title = "engine stopped"
        self.refresh_bindings()

    # -- sending ---------------------------------------------------------------------------
    @on(ChatPane.Submitted)
    async def _chat_submitted(self, message: ChatPane.Submitted) -> None:
        await self.send(message.text)

    @on(CountStepper.Changed)
    def _copies_changed(self) -> None:
        self._update_estimate()

    # -- load ------------------------------------------------------------------------------
    @on(CountStepper.Changed, "#load-users")
    def _load_users_changed(self, message: CountStepper.Changed) -> None:
        load = self.live_load
        load.users = message.value
        if load.users == 0:
            # Cancelling the worker walks away from every stream: the engine aborts them.
            self.workers.cancel_group(self, "load")
            load.stopped()
        elif self.engine_state == "ready" and not self._load_running:
            self._run_load()
        self._show_load()

    def _show_load(self) -> None:
        clock = self.engine.features.clock
        now = clock.now() if clock is not None else time.perf_counter()
        line = self.controls.query_one("#load-line", Static)
        words = self.live_load.words(now)
        if str(line.render()) != words:
            line.update(words)

    @work(group="load", exclusive=True, exit_on_error=False)
    async def _run_load(self) -> None:
        """Load points one after another while there are users; a change of users takes
        effect at the next point."""
        from bench.load_runner import LoadLevel, LoadRunner

        load = self.live_load
        self._load_running = True
        try:
            while load.users > 0 and self.engine_state == "ready":
                users, card = load.users, self.card
                prompt = self.controls.prompt_tokens if self.controls.synthetic else 128
                if card is not None and card.max_model_len:
                    prompt = min(prompt, card.max_model_len - 2)
                output = max(1, self.controls.sampling().max_tokens)
                if card is not None and card.max_model_len:
                    output = max(1, min(output, card.max_model_len - prompt - 1))
                config = live_config(users, prompt, output, seed=random.randrange(2**31))
                runner = LoadRunner(self.engine, config)
                if load.ceiling is None and card is not None:
                    load.ceiling = await asyncio.to_thread(load_ceiling, card, prompt + output // 2)
                load.started_point(users, runner.clock.now())
                self._show_load()
                load.measured(await runner.measure(LoadLevel.users(users)))
                self._show_load()
        finally:
            self._load_running = False
            load.stopped()
            self._show_load()

    @on(ControlsPanel.SyntheticSendRequested)
    async def _synthetic_requested(self) -> None:
        await self.send(self.chat.input.value.strip(), synthetic=True)

    async def send(self, text: str, *, synthetic: bool | None = None) -> bool:
        """Send `text` (as chat, or after a synthetic prompt) with the controls' settings.

        Returns False when nothing was sent (engine not ready, or a reply still streaming).
        """
        if self.engine_state != "ready":
            self.notify(fmt.state_words(self.engine_state, "refusal"), severity="warning")
            return False
        if self.busy:
            # Twenty fast Enters must not stack twenty toasts over the engine panel.
            if not self._busy_notified:
                self._busy_notified = True
                self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return False
        controls = self.controls
        problem = controls.sampling_problem()
        if problem is not None:
            await self.chat.add_notice(f"✗ Not sent. {problem}", error=True)
            return False
        synthetic = controls.synthetic if synthetic is None else synthetic
        sampling = controls.sampling()
        copies = controls.concurrency
        card = self.card
        n = controls.prompt_tokens
        if synthetic and card is not None and not prompt_fits(n, card.max_model_len):
            # Refused before anything is built: a synthetic prompt of 10^9 tokens would
            # take gigabytes to make only to be refused. vLLM's rule: prompt < M.
            error = PromptTooLong(n, card.max_model_len)
            controls.show_error(error.plain())
            # Said where the user pressed Enter too (at 80x24 the slider is on another tab).
            await self.chat.add_notice(f"✗ Not sent. {error.plain()}", error=True)
            return False
        if synthetic:
            guess = self.send_estimate()
            if guess is not None and guess.long:
                self.notify(f"{guess.words()}: the reply starts after that.", title="Long send")
        turn = self.conversation.next_turn()
        ids = [f"r{turn}"] + [f"r{turn}.{k}" for k in range(2, copies + 1)]
        self.chat.input.value = ""
        self.busy = True
        self._busy_notified = False
        self._current_user_text = text
        self._current_synthetic = synthetic
        if synthetic:
            controls.show_error(None)
        note, title = send_labels(ids, n if synthetic else None)
        if self.live_load.users:
            # Its timings are taken under the load's traffic: say so where they are read.
            title += f" · under load ({fmt.count(self.live_load.users, 'user')})"
        await self.chat.add_user_message(text, note)
        reply = await self.chat.add_reply(title, ids, self._status_of, synthetic=synthetic)
        self.current = reply
        self.telemetry.track_request(ids[0])
        self.refresh_bindings()
        try:
            if synthetic:
                # Tokenising a long prompt can take a while on the real engine: not on the loop.
                # One seed per copy: copies that shared a prompt would share its KV
                # blocks through prefix caching and never fill the pool. EOS is ignored
                # so every copy decodes max tokens, as a benchmark request does.
                # A seed per turn too: the 1,024-token prompt after a 512-token one must
                # not find its first half in the prefix cache (TTFT would look cheap).
                prompts = [
                    await asyncio.to_thread(
                        self.engine.synthetic_prompt, n, text, turn * 1_000 + copy
                    )
                    for copy in range(len(ids))
                ]
                walking = dataclasses.replace(sampling, ignore_eos=True)
                requests = [
                    GenerationRequest(rid, prompt_token_ids=prompt, sampling=walking)
                    for rid, prompt in zip(ids, prompts, strict=True)
                ]
            else:
                messages = self.conversation.request_messages(text)
                requests = [
                    GenerationRequest(rid, messages=messages, sampling=sampling) for rid in ids
                ]
        except Exception as exc:
            words = (
                exc.plain()
                if isinstance(exc, KvscopeError)
                else f"could not build the prompt: {exc}"
            )
            for copy in range(copies):
                await reply.fail(copy, words)
            if isinstance(exc, KvscopeError):
                await self._request_failed(exc)
            self._reply_over(reply)
            return True
        tape = self.engine.features.tape
        if tape is not None:
            # The session's tape keeps what the user sent, for replay and --resume.
            tape.record_user_message(
                text, request_ids=ids, synthetic_tokens=n if synthetic else None
            )
        for copy, request in enumerate(requests):
            self.run_worker(
                self._stream(reply, copy, request), group="requests", exit_on_error=False
            )
        return True

    async def _stream(self, reply: ReplyBlock, copy: int, request: GenerationRequest) -> None:
        """Feed one request's events to its reply (a worker on the app's loop)."""
        try:
            async for event in self.engine.stream(request):
                if isinstance(event, TokenEvent):
                    self.telemetry.add_token(event)
                    await reply.add_token(copy, event)
                elif isinstance(event, RequestAccepted):
                    self.telemetry.add_accepted(event)
                    reply.accepted(copy)
                elif isinstance(event, RequestFinished):
                    self.telemetry.add_finished(event)
                    await reply.finish(copy, event)
            if not reply.copies[copy].done:
                await reply.fail(copy, "the engine ended the stream without finishing it")
        except KvscopeError as exc:
            await reply.fail(copy, exc.plain())
            if copy == 0 or isinstance(exc, EngineDied):
                await self._request_failed(exc)
        except asyncio.CancelledError:
            # A new chat or the app closing: the reply is being thrown away with it.
            raise
        except Exception as exc:  # an engine bug must not take the transcript with it
            await reply.fail(copy, f"unexpected engine error: {type(exc).__name__}: {exc}")
        finally:
            if reply.done:
                self._reply_over(reply)

    def _status_of(self, request_id: str, accepted: bool) -> RequestStatus:
        return self.telemetry.status(request_id, accepted=accepted)

    async def _request_failed(self, error: KvscopeError) -> None:
        if isinstance(error, PromptTooLong) and self._current_synthetic:
            self.controls.show_error(error.plain())
        if isinstance(error, EngineDied):
            self._engine_died(error)

    def _reply_over(self, reply: ReplyBlock) -> None:
        if reply is not self.current or not self.busy:
            return
        summary = reply.summary()
        if not self._current_synthetic and not summary.failed and summary.text:
            self.conversation.record(self._current_user_text, summary.text)
        self.call_later(self._settle_transcript)
        self.busy = False
        self._busy_notified = False
        self._update_estimate()  # the reply measured the prefill rate: a better guess
        self.refresh_bindings()

    async def _settle_transcript(self) -> None:
        """Between replies (the user is reading): fold old replies, then collect garbage."""
        await self.chat.fold_older()
        if self.gc_policy is not None:
            self.gc_policy.idle()

    # -- redraw ----------------------------------------------------------------------------
    async def _tick(self) -> None:
        # Chat and engine panel take turns, each at half the timer's rate. A frame repaints
        # the box around everything that changed; when both halves change in one frame
        # that box is nearly the whole screen, and each frame costs about twice as much.
        self._ticks += 1
        with self.app.batch_update():
            if self._ticks % 2:
                if self.current is not None:
                    await self.current.tick()
            else:
                await self.engine_panel.redraw(self.renderer, wait=False)
                if self.live_load.running_since is not None:
                    self._show_load()
        if self.gc_policy is not None and self.busy:
            self.gc_policy.streaming_tick()

    async def redraw(self, *, wait: bool = True) -> None:
        """Bring the live parts up to date from the buffers (the timer does it in turns).

        With `wait`, a draw already in progress is waited for and followed by a fresh one,
        so that afterwards the screen shows everything received so far (tests, the demo).
        """
        with self.app.batch_update():
            if self.current is not None:
                await self.current.tick()
            await self.engine_panel.redraw(self.renderer, wait=wait)

    # -- actions ---------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.busy
        if action == "restart_engine":
            return self.engine_state in ("failed", "dead")
        return True

    def action_stop(self) -> None:
        """Abort every copy of the running reply; each stream then ends with "abort"."""
        if self.current is None:
            return
        for request_id in self.current.running_ids:
            self.engine.abort(request_id)

    async def action_new_chat(self) -> None:
        tape = self.engine.features.tape
        if tape is not None:
            tape.record_new_chat()  # --resume restores only what follows
        # Cancelling the workers makes each stream abort its request, so blocks come back.
        self.workers.cancel_group(self, "requests")
        self.current = None
        self.busy = False
        self._busy_notified = False
        # The cancelled streams never see their finish: forget their tracks here.
        self.telemetry.requests.clear()
        self.conversation.clear()
        remote = self.engine.features.remote
        if remote is not None:
            remote.new_session()  # a remote server's cached blocks are coloured by chat
        await self.chat.clear()
        if self.gc_policy is not None:
            self.gc_policy.idle(full=True)  # the old transcript's cycles are garbage now
        self.chat.input.focus()
        self.refresh_bindings()

    def action_toggle_synthetic(self) -> None:
        """Turn the prompt-length slider on (Enter sends N synthetic tokens) or off."""
        controls = self.controls
        controls.synthetic = not controls.synthetic
        self.notify(
            f"Slider on: Enter sends {controls.prompt_tokens:,} synthetic tokens."
            if controls.synthetic
            else "Slider off: Enter sends your message as chat.",
            timeout=2,
        )

    def action_prompt_length(self, factor: int) -> None:
        """Double (2) or halve (-2) the slider's length, and turn the slider on."""
        slider = self.controls.slider
        slider.scale(2.0 if factor > 0 else 0.5)

    def action_load_users(self, factor: int) -> None:
        """Double the Load box's users (off becomes one), or turn the load off (0)."""
        stepper = self.controls.query_one("#load-users", CountStepper)
        stepper.value = 0 if factor == 0 else max(1, stepper.value * factor)

    def action_scroll_panel(self, direction: int) -> None:
        """PageUp / PageDown scroll the panel in use, wherever the focus is in it."""
        focused = self.focused
        narrow = self.has_class("-narrow")
        for name in PANELS:
            panel = self.query_one(f"#{name}")
            # Narrow: the tab on screen, even while the focus stays in the message box.
            if (
                panel.has_class("-active")
                if narrow
                else (focused is not None and panel in focused.ancestors_with_self)
            ):
                break
        else:
            name = "chat"
        target = {
            "chat": self.chat.transcript,
            "engine": self.engine_panel.query_one("#engine-grid"),
            "controls": self.controls,
        }[name]
        if direction > 0:
            target.scroll_page_down(animate=False)
        else:
            target.scroll_page_up(animate=False)

    def action_toggle_latency(self) -> None:
        self.latency_colours = not self.latency_colours

    def action_clear_plots(self) -> None:
        """Start the session's plots afresh (the chat and the engine are untouched)."""
        self.telemetry.clear_plots()
        self.engine_panel.invalidate()
        self.notify("Plots cleared.", timeout=2)

    def action_toggle_log_latency(self) -> None:
        panel = self.engine_panel
        panel.log_latency = not panel.log_latency

    def action_toggle_timeline(self) -> None:
        """The ITL plot's box shows the request timeline, or the ITL plot again."""
        self.action_show_panel("engine")
        box = self.engine_panel.query_one(LatencyBox)
        box.toggle()
        self.call_after_refresh(box.scroll_visible, animate=False)

    def action_toggle_roofline(self) -> None:
        """Show the engine's steps under the roofs (a box of the Engine column), or not."""
        self.action_show_panel("engine")
        panel = self.engine_panel
        panel.show_roofline = not panel.show_roofline
        if panel.show_roofline:
            box = panel.query_one("#roofline-box")
            self.call_after_refresh(box.scroll_visible, animate=False)

    def action_restart_engine(self) -> None:
        if self.engine_state in ("failed", "dead"):
            self.start_engine()
            self.refresh_bindings()

    def action_show_panel(self, panel: str) -> None:
        if self.has_class("-narrow"):
            self.query_one(Tabs).active = f"tab-{panel}"
        if panel == "chat":
            self.chat.input.focus()
        elif panel == "controls":
            slider = self.controls.slider
            slider.focus()
            # The panel may only now become visible: scroll once it has a place on screen.
            self.call_after_refresh(slider.scroll_visible, animate=False)

    @on(Tabs.TabActivated, "#panel-tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        chosen = (event.tab.id or "tab-chat").removeprefix("tab-")
        for name in PANELS:
            self.query_one(f"#{name}").set_class(name == chosen, "-active")

    def watch_busy(self) -> None:
        self.refresh_bindings()
