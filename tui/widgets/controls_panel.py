"""ControlsPanel: the model card, sampling, the prompt-length slider and concurrency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Button, Input, Label, Static, Switch

from engine.events import EngineState, ModelCard, SamplingSettings
from tui import format as fmt
from tui.widgets.count_stepper import CountStepper
from tui.widgets.model_card import ModelCardView
from tui.widgets.prompt_length_slider import PromptLengthSlider

if TYPE_CHECKING:
    from textual.app import ComposeResult

DEFAULT_MAX_TOKENS = 128
MIN_CONCURRENCY_CAP = 16
MAX_LOAD_USERS = 64  # past that a CPU engine only queues; a bench run goes higher
MAX_NUM_SEQS = 256
"""vLLM's default cap on requests running at once: more copies than this only queue."""
DEFAULT_FIRST_PROMPT = 1024
"""Where the slider starts when no wall is known (a server that says neither)."""


def concurrency_cap(card: ModelCard | None) -> int:
    """The most copies worth offering: every copy holds at least one block of the pool,
    so more copies than blocks can never all run (nor more than vLLM's max_num_seqs)."""
    if card is None:
        return MIN_CONCURRENCY_CAP
    return max(MIN_CONCURRENCY_CAP, min(MAX_NUM_SEQS, card.total_blocks))


def copies_that_fit(card: ModelCard, prompt_tokens: int, max_tokens: int) -> int:
    """How many requests of this prompt and output fit in the pool at once (whole blocks)."""
    need = card.blocks_for(max(1, prompt_tokens + max(0, max_tokens)))
    return card.total_blocks // max(1, need)


class ControlsPanel(VerticalScroll):
    """Everything that shapes the next request. It only reports; the screen sends."""

    card: reactive[ModelCard | None] = reactive(None)
    """The loaded model, or None while loading."""
    engine_state: reactive[EngineState] = reactive[EngineState]("loading")
    """Bound from the screen, passed to the model card."""
    synthetic_tokens: reactive[int | None] = reactive(None)
    """The length of the synthetic prompt the next send will be, or None when it is chat."""
    estimate_text: reactive[str] = reactive("")
    """How long the next synthetic send will prefill, when the screen can tell."""

    @dataclass
    class SyntheticSendRequested(Message):
        """The user asked to send the synthetic prompt now (the Send button)."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._touched_slider = False
        self._read_only = False
        self._defaults: tuple[int, bool, int, str, str] | None = None  # as a replay opened
        self.replay_words = ""
        """In a replay: whose settings the panel shows ("" live), as its boxes say."""

    def compose(self) -> ComposeResult:
        with Vertical(id="model-box", classes="box") as box:
            box.border_title = "Model"
            yield ModelCardView().data_bind(ControlsPanel.card, ControlsPanel.engine_state)
        with Vertical(id="sampling-box", classes="box") as box:
            box.border_title = "Sampling"
            with Horizontal(classes="field"):
                yield Label("max tokens", classes="field-label")
                # Compact (borderless) fields: at 80x24 every row of this panel counts.
                yield Input(str(DEFAULT_MAX_TOKENS), type="integer", id="max-tokens", compact=True)
            with Horizontal(classes="field"):
                yield Label("temperature", classes="field-label")
                yield Input("0.0", type="number", id="temperature", compact=True)
        with Vertical(id="prompt-box", classes="box") as box:
            box.border_title = "Prompt length"
            with Horizontal(classes="field", id="synthetic-field"):
                yield Switch(False, id="synthetic-switch")
                yield Static("", id="synthetic-state")
            yield PromptLengthSlider(id="slider")
            yield Static("", id="slider-error")
            yield Static("", id="send-estimate")
        with Vertical(id="concurrency-box", classes="box") as box:
            box.border_title = "Concurrency"
            with Horizontal(classes="field"):
                yield CountStepper(
                    1, maximum=MIN_CONCURRENCY_CAP, unit="copy", units="copies", id="concurrency"
                )
            yield Static("", id="fit-line")
            yield Static(
                "copies share the KV pool, fill it and provoke preemption",
                classes="hint",
            )
        with Vertical(id="load-box", classes="box") as box:
            box.border_title = "Load"
            with Horizontal(classes="field"):
                yield CountStepper(
                    0,
                    minimum=0,
                    maximum=MAX_LOAD_USERS,
                    unit="user",
                    units="users",
                    id="load-users",
                )
            yield Static("off", id="load-line")
            # Shown while the load is off: once it runs, the line above says what it does,
            # and the box keeps to the rows it has at 160x48 (controls_panel.tcss).
            yield Static(
                "each user sends the slider's prompt when its last reply ends; every 10 s "
                "is a point on the Load plot",
                classes="hint",
                id="load-hint",
            )
        yield Button("Send synthetic prompt", id="send-synthetic", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#slider-error", Static).display = False
        self.query_one("#send-estimate", Static).display = False
        self.slider.max_tokens = self.max_tokens
        self.watch(self.slider, "value", self._sync_synthetic, init=False)
        self.watch(self.query_one("#load-users", CountStepper), "value", self._load_users_set)
        self._sync_synthetic()

    # -- what the screen reads -------------------------------------------------------------
    @property
    def slider(self) -> PromptLengthSlider:
        return self.query_one(PromptLengthSlider)

    @property
    def synthetic(self) -> bool:
        return self.query_one("#synthetic-switch", Switch).value

    @synthetic.setter
    def synthetic(self, on: bool) -> None:
        self.query_one("#synthetic-switch", Switch).value = on

    @property
    def prompt_tokens(self) -> int:
        return self.slider.value

    @property
    def concurrency(self) -> int:
        return self.query_one(CountStepper).value

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self.query_one(CountStepper).value = value

    @property
    def max_tokens(self) -> int:
        return self.sampling().max_tokens

    def sampling(self) -> SamplingSettings:
        """The sampling settings typed in, with bad or empty fields at their defaults."""
        max_tokens = int(_parse(self.query_one("#max-tokens", Input).value, DEFAULT_MAX_TOKENS))
        temperature = _parse(self.query_one("#temperature", Input).value, 0.0)
        limit = self.card.max_model_len if self.card and self.card.max_model_len else 1_000_000
        return SamplingSettings(
            max_tokens=max(1, min(max_tokens, limit)),
            temperature=max(0.0, min(temperature, 2.0)),
        )

    def sampling_problem(self) -> str | None:
        """Why the typed sampling cannot be sent, in one line; None when it can. A max
        tokens under 1 is refused, not quietly made 1: the user typed a number."""
        raw = self.query_one("#max-tokens", Input).value.strip()
        try:
            typed = int(raw)
        except ValueError:
            return None  # empty or half-typed: the default, as the field's placeholder says
        if typed < 1:
            return f"max tokens is {typed:,}: give at least 1"
        return None

    # -- reactions -------------------------------------------------------------------------
    def watch_card(self, card: ModelCard | None) -> None:
        slider = self.slider
        slider.card = card
        stepper = self.query_one(CountStepper)
        stepper.maximum = concurrency_cap(card)
        stepper.refresh()
        if card is not None and not self._touched_slider:
            # Start half-way to the nearest wall, where a first prompt fits comfortably.
            nearest = card.nearest_known_limit or DEFAULT_FIRST_PROMPT * 2
            block = max(card.block_size, 1)  # 0: a remote card that does not know it
            slider.value = max(slider.minimum, (nearest // 2) // block * block)
        self._sync_synthetic()

    @on(PromptLengthSlider.Changed)
    def _slider_moved(self, event: PromptLengthSlider.Changed) -> None:
        # Using the slider means "send prompts of this length".
        self._touched_slider = True
        self.synthetic = True
        self.show_error(None)

    @on(PromptLengthSlider.Toggled)
    def _slider_toggled(self, event: PromptLengthSlider.Toggled) -> None:
        self._touched_slider = True
        self.synthetic = not self.synthetic

    @on(CountStepper.Changed)
    def _concurrency_changed(self, event: CountStepper.Changed) -> None:
        self.slider.concurrency = event.value
        self._sync_synthetic()

    def _load_users_set(self, users: int) -> None:
        self.query_one("#load-box").set_class(users > 0, "-running")

    @on(Switch.Changed, "#synthetic-switch")
    def _switch_flipped(self, event: Switch.Changed) -> None:
        self._sync_synthetic()

    @on(Input.Changed, "#max-tokens")
    def _max_tokens_typed(self, event: Input.Changed) -> None:
        self.slider.max_tokens = self.max_tokens
        self._sync_synthetic()

    def _sync_synthetic(self, *_: object) -> None:
        """Keep `synthetic_tokens`, the switch's words and the fit line true to the controls."""
        if not self.is_mounted:
            return
        on = self.synthetic
        n = self.slider.value
        self.synthetic_tokens = n if on else None
        state = self.query_one("#synthetic-state", Static)
        state.set_class(on, "-on")
        if self._read_only:  # a replay: what the tape's send was, not what Enter does
            words = f"ON: the send was {n:,} synthetic tokens" if on else "OFF: the send was chat"
        elif on:
            words = f"ON: Enter sends {n:,} synthetic tokens"
        else:
            words = "OFF: Enter sends your message as chat"
        state.update(Text(words))
        card = self.card
        fit = self.query_one("#fit-line", Static)
        if card is None:
            fit.update("")
            return
        fits = copies_that_fit(card, n, self.max_tokens)
        copies = self.concurrency
        fit.set_class(copies > fits, "-over")
        fit.update(
            Text(
                f"{fmt.count(fits, 'copy', 'copies')} of {n:,} + {self.max_tokens:,} tokens "
                f"{'fits' if fits == 1 else 'fit'} in the pool at once"
                + (f": {copies - fits:,} will queue or preempt" if copies > fits else "")
            )
        )

    # -- a replay: the tape's settings, read-only ------------------------------------------
    def make_read_only(self) -> None:
        """A replay: nothing here takes a key or a click, and the send button goes. The
        boxes say whose settings they show (`show_tape_send`)."""
        for widget in (
            *self.query(Input),
            *self.query(Switch),
            *self.query(CountStepper),
            self.slider,
        ):
            widget.disabled = True
        self._read_only = True
        self.query_one("#send-synthetic").display = False
        self.query_one("#load-hint").display = False
        self.show_tape_send(None)

    def show_tape_send(
        self,
        request_id: str | None,
        *,
        synthetic_tokens: int | None = None,
        copies: int = 1,
        sampling: SamplingSettings | None = None,
    ) -> None:
        """Show the settings of the tape's send `request_id` (None: before its first send,
        where the panel's values are its defaults, not the tape's, and it says so)."""
        tape = f"{request_id}'s, from the tape" if request_id is not None else None
        theirs = "not the tape's: no send yet"
        if request_id is not None and sampling is not None:
            if self._defaults is None:  # what a rewind to the start puts back
                self._defaults = (
                    self.slider.value,
                    self.synthetic,
                    self.concurrency,
                    self.query_one("#max-tokens", Input).value,
                    self.query_one("#temperature", Input).value,
                )
            self._touched_slider = True  # a card arriving later must not move it back
            if synthetic_tokens is not None:
                self.slider.value = synthetic_tokens
            self.synthetic = synthetic_tokens is not None
            self.concurrency = copies
            self.query_one("#max-tokens", Input).value = str(sampling.max_tokens)
            self.query_one("#temperature", Input).value = f"{sampling.temperature:g}"
        elif self._defaults is not None:  # rewound before the first send: as it opened
            value, on, copies, max_tokens, temperature = self._defaults
            self.slider.value, self.synthetic, self.concurrency = value, on, copies
            self.query_one("#max-tokens", Input).value = max_tokens
            self.query_one("#temperature", Input).value = temperature
        for box in ("#sampling-box", "#prompt-box", "#concurrency-box"):
            self.query_one(box).border_subtitle = tape or theirs
        # The live load is the playground's own traffic, never a setting a tape replays.
        self.query_one("#load-box").border_subtitle = "not replayed"
        self.replay_words = f"{tape or theirs} · load not replayed"
        self._sync_synthetic()

    def watch_estimate_text(self, text: str) -> None:
        box = self.query_one("#send-estimate", Static)
        text = "" if self._read_only else text  # a replay sends nothing: no next send
        box.display = bool(text)
        box.update(Text(text))

    @on(Button.Pressed, "#send-synthetic")
    def _send(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.SyntheticSendRequested())

    def show_error(self, message: str | None) -> None:
        """Show the engine's answer to the last synthetic prompt next to the slider."""
        box = self.query_one("#slider-error", Static)
        box.display = bool(message)
        box.update(Text(f"✗ {message}") if message else "")


def _parse(raw: str, default: float) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        return default
