"""PromptLengthSlider: pick an exact prompt length, with the engine's walls on the ruler."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from tui import format as fmt

if TYPE_CHECKING:
    from textual import events

    from engine.events import ModelCard

UNKNOWN_CONTEXT_REACH = 8192
"""How far the ruler reaches (÷ 1.25) when the server does not say its context limit."""
MAX_MODEL_LEN_CONSEQUENCE = "at or past max_model_len: the engine will refuse this prompt"
KV_POOL_CONSEQUENCE = "past the KV pool: requests will be preempted/queued"
NEAR_KV_POOL = "close to the KV pool wall: a little more output or one more copy preempts"
WARNING_SHARE = 0.9
"""The warning zone starts at this share of the K wall."""


@dataclass(frozen=True)
class Wall:
    """A prompt length past which something changes, and what changes."""

    kind: str  # "max_model_len", "kv_pool" or "gpu"
    tokens: int
    marker: str
    label: str
    consequence: str
    inclusive: bool = False
    """The wall's own length is already past it (vLLM refuses a prompt of max_model_len)."""
    note: str = ""
    """A line said under the wall's own (K when the emulated GPU's wall is K itself)."""

    def passed_by(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.tokens if self.inclusive else prompt_tokens > self.tokens

    def warns(self, prompt_tokens: int) -> bool:
        """In the zone just under a pool wall, where output growth alone can cross it."""
        if self.kind == "max_model_len" or self.passed_by(prompt_tokens):
            return False
        return prompt_tokens > self.tokens * WARNING_SHARE


def pool_share(total_blocks: int, block_size: int, concurrency: int, max_tokens: int) -> int:
    """The longest prompt each of `concurrency` copies can have, output included.

    Each copy holds whole blocks for its prompt and its `max_tokens` of output: the
    arithmetic of `roofline`'s "requests that fit at once", solved for the prompt.
    """
    c = max(1, concurrency)
    return max(0, (total_blocks // c) * block_size - max(0, max_tokens))


def walls_for(card: ModelCard, concurrency: int, max_tokens: int = 0) -> list[Wall]:
    """The walls one request meets when `concurrency` copies run together, each
    generating up to `max_tokens`."""
    c = max(1, concurrency)
    share = "" if c == 1 else f" ÷ {c}"
    out = f" − {max_tokens:,} out" if max_tokens > 0 else ""
    # "KV pool ÷ 3 − 128 out = 2,688": arithmetic shown gets its "=".
    eq = " =" if share or out else ""
    # The emulated GPU's pool is scaled from another model; its context limit is not
    # emulated: M stays this model's, and the label says so.
    m_label = "max_model_len" if card.emulation is None else "max_model_len (this model's)"
    walls = [
        Wall(
            "max_model_len",
            card.max_model_len,
            "M",
            m_label,
            MAX_MODEL_LEN_CONSEQUENCE,
            inclusive=True,
        ),
        Wall(
            "kv_pool",
            pool_share(card.total_blocks, card.block_size, c, max_tokens),
            "K",
            f"KV pool{share}{out}{eq}",
            KV_POOL_CONSEQUENCE,
        ),
    ]
    if card.emulation is not None:
        gpu = card.emulation.gpu
        blocks = card.emulation.pool_tokens // max(1, card.block_size)
        g = pool_share(blocks, card.block_size, c, max_tokens)
        if abs(blocks - card.total_blocks) <= 1:
            # The pool here was sized as the GPU's (vLLM may keep a block back): G would
            # only sit on K, and be "off the ruler" twice. One wall, and a line why.
            scale = card.emulation.scale
            sized = f"the {gpu}'s" if scale >= 1 else f"{scale:.0%} of the {gpu}'s"
            walls[1] = dataclasses.replace(
                walls[1],
                consequence=(
                    f"past the KV pool here and on a real {gpu}: requests will be preempted/queued"
                ),
                note=f"G = K (the pool is sized as {sized})",
            )
        else:
            walls.append(
                Wall(
                    "gpu",
                    g,
                    "G",
                    f"{gpu} KV pool{share}{out}{eq}",
                    f"past the {gpu} KV pool: on a real {gpu} requests would be preempted/queued",
                )
            )
    # A wall nobody told (a server that says no max_model_len, or no pool) is not drawn;
    # one told but already passed (a pool share under the output) still is.
    told = {"max_model_len": card.max_model_len > 0, "kv_pool": card.total_blocks > 0}
    return sorted((w for w in walls if told.get(w.kind, True)), key=lambda w: (w.tokens, w.marker))


def consequences(passed: list[Wall]) -> list[str]:
    """What passing these walls means, once each: past both K and G the two pool
    sentences say one thing, so they become one line."""
    kinds = {w.kind: w for w in passed}
    gpu = kinds.get("gpu")
    if "kv_pool" in kinds and gpu is not None:
        name = gpu.label.split(" KV pool")[0]
        merged = f"past the KV pool here and on a real {name}: requests will be preempted/queued"
        rest = [w.consequence for w in passed if w.kind not in ("kv_pool", "gpu")]
        return [*rest, merged]
    return [w.consequence for w in passed]


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


class PromptLengthSlider(Widget, can_focus=True):
    """A keyboard slider for a prompt length in tokens.

    Left/right move by a small step (a block, on small models), shift+left/right and
    page up/down by a big one, home/end to the ends. The ruler runs to 1.25 × max_model_len
    so the user can walk past every wall that matters: past max_model_len the engine
    refuses, so nothing further would show anything new.
    """

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    PromptLengthSlider {
        height: auto;
        width: 1fr;
        padding: 0 1;
        border: round $panel-lighten-2;
    }
    PromptLengthSlider:focus {
        border: round $primary;
    }
    PromptLengthSlider.-past-wall {
        border: round $error;
    }
    PromptLengthSlider > .prompt-length-slider--value { color: $foreground; text-style: bold; }
    PromptLengthSlider > .prompt-length-slider--muted { color: $foreground-muted; }
    PromptLengthSlider > .prompt-length-slider--track { color: $foreground 35%; }
    PromptLengthSlider > .prompt-length-slider--filled { color: $primary; }
    PromptLengthSlider > .prompt-length-slider--knob { color: $accent; text-style: bold; }
    PromptLengthSlider > .prompt-length-slider--wall { color: $warning; text-style: bold; }
    PromptLengthSlider > .prompt-length-slider--past { color: $error; }
    PromptLengthSlider > .prompt-length-slider--ok { color: $success; }
    PromptLengthSlider.-near-wall {
        border: round $warning;
    }
    PromptLengthSlider > .prompt-length-slider--near { color: $warning; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Shorter", show=False),
        Binding("right", "step(1)", "Longer", show=False),
        Binding("shift+left,pagedown", "step(-10)", "Much shorter", show=False),
        Binding("shift+right,pageup", "step(10)", "Much longer", show=False),
        Binding("home", "jump(-1)", "Shortest", show=False),
        Binding("end", "jump(1)", "Longest", show=False),
        Binding("space", "toggle_synthetic", "Slider on / off", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "prompt-length-slider--value",
        "prompt-length-slider--track",
        "prompt-length-slider--filled",
        "prompt-length-slider--knob",
        "prompt-length-slider--wall",
        "prompt-length-slider--past",
        "prompt-length-slider--muted",
        "prompt-length-slider--ok",
        "prompt-length-slider--near",
    }

    value: reactive[int] = reactive(512, layout=True)
    """The prompt length, in tokens."""
    card: reactive[ModelCard | None] = reactive(None, layout=True)
    """The loaded model; its limits are the walls. None while the engine loads."""
    concurrency: reactive[int] = reactive(1, layout=True)
    """Copies sent at once; they share the KV pool, which moves its wall."""
    max_tokens: reactive[int] = reactive(0, layout=True)
    """Output tokens each copy may generate: they need room in the pool too."""

    @dataclass
    class Changed(Message):
        """The user moved the slider."""

        slider: PromptLengthSlider
        value: int

        @property
        def control(self) -> PromptLengthSlider:
            return self.slider

    @dataclass
    class Toggled(Message):
        """The user pressed Space on the slider: turn synthetic sends on or off."""

        slider: PromptLengthSlider

        @property
        def control(self) -> PromptLengthSlider:
            return self.slider

    def __init__(
        self,
        value: int = 512,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.set_reactive(PromptLengthSlider.value, value)

    # -- scale -----------------------------------------------------------------------------
    @property
    def minimum(self) -> int:
        return 16

    @property
    def maximum(self) -> int:
        if self.card is None:
            return 2560
        return _round_up(self._reach * 1.25, self.small_step)

    @property
    def _reach(self) -> int:
        # A server that does not say its limit: the ruler reaches UNKNOWN_CONTEXT_REACH.
        if self.card is None or self.card.max_model_len <= 0:
            return UNKNOWN_CONTEXT_REACH
        return self.card.max_model_len

    @property
    def small_step(self) -> int:
        if self.card is None:
            return 16
        block = max(1, self.card.block_size)
        span = self._reach * 1.25
        if span / block <= 320:
            return block
        # Long contexts: about 200 small steps end to end, still whole blocks.
        return _round_up(span / 200, block)

    @property
    def big_step(self) -> int:
        return self.small_step * 10

    def walls(self) -> list[Wall]:
        return walls_for(self.card, self.concurrency, self.max_tokens) if self.card else []

    def walls_passed(self) -> list[Wall]:
        return [w for w in self.walls() if w.passed_by(self.value)]

    def walls_near(self) -> list[Wall]:
        return [w for w in self.walls() if w.warns(self.value)]

    # -- state -----------------------------------------------------------------------------
    def validate_value(self, value: int) -> int:
        return max(self.minimum, min(int(value), self.maximum))

    def _sync_state(self) -> None:
        passed = bool(self.walls_passed())
        self.set_class(passed, "-past-wall")
        self.set_class(not passed and bool(self.walls_near()), "-near-wall")

    def watch_value(self) -> None:
        self._sync_state()

    def watch_card(self) -> None:
        self.value = self.validate_value(self.value)
        self._sync_state()

    def watch_concurrency(self) -> None:
        self._sync_state()

    def watch_max_tokens(self) -> None:
        self._sync_state()

    def _move_to(self, value: int) -> None:
        new = self.validate_value(value)
        if new != self.value:
            self.value = new
        # Posted even at an end stop: pressing a key on the slider means "use it".
        self.post_message(self.Changed(self, self.value))

    def action_step(self, steps: int) -> None:
        step = self.big_step if abs(steps) >= 10 else self.small_step
        direction = 1 if steps > 0 else -1
        # Snap to the step grid first, so keyboard values stay round numbers.
        base = (self.value // step) * step
        if direction < 0 and base < self.value:
            self._move_to(base)
        else:
            self._move_to(base + direction * step)

    def action_toggle_synthetic(self) -> None:
        self.post_message(self.Toggled(self))

    def scale(self, factor: float) -> None:
        """Multiply the length by `factor` (2 or 0.5: the article's 512, 1,024, 2,048,
        4,096 walk), onto whole blocks."""
        block = self.card.block_size if self.card is not None else 16
        target = max(block, round(self.value * factor / block) * block)
        self._move_to(target)

    def action_jump(self, direction: int) -> None:
        self._move_to(self.maximum if direction > 0 else self.minimum)

    def on_click(self, event: events.Click) -> None:
        width = self.content_size.width
        if width > 1 and event.y == 1:
            self._move_to(round(event.x / (width - 1) * self.maximum))

    # -- drawing ---------------------------------------------------------------------------
    def _position(self, tokens: int, width: int) -> int:
        return max(0, min(width - 1, round(tokens / self.maximum * (width - 1))))

    def render(self) -> Text:
        style = self.get_component_rich_style
        width = max(12, self.content_size.width)
        walls = self.walls()
        passed = self.walls_passed()
        text = Text(end="")
        text.append(f"{self.value:,} tok", style("prompt-length-slider--value"))
        if self.card is not None and self.card.block_size > 0:  # 0: the server did not say
            blocks = self.card.blocks_for(self.value)
            text.append(
                f" = {fmt.count(blocks, 'block')} of {self.card.block_size}",
                style("prompt-length-slider--muted"),
            )
        text.append("\n")

        knob = self._position(self.value, width)
        first_wall = min((w.tokens - (1 if w.inclusive else 0) for w in walls), default=None)
        danger_from = self._position(first_wall, width) if first_wall is not None else width
        wall_at = {self._position(w.tokens, width): w for w in walls if w.tokens <= self.maximum}
        for x in range(width):
            if x == knob:
                text.append("●", style("prompt-length-slider--knob"))
            elif x in wall_at:
                hit = wall_at[x] in passed
                text.append(
                    "┃",
                    style("prompt-length-slider--past" if hit else "prompt-length-slider--wall"),
                )
            elif x < knob:
                past = x > danger_from
                text.append(
                    "━",
                    style("prompt-length-slider--past" if past else "prompt-length-slider--filled"),
                )
            else:
                past = x > danger_from
                text.append(
                    "╌" if past else "─",
                    style("prompt-length-slider--past" if past else "prompt-length-slider--track"),
                )
        text.append("\n")

        # Wall letters under the ruler; a letter that would land on another moves right.
        marks = [" "] * width
        mark_style = ["prompt-length-slider--wall"] * width
        for wall in walls:
            if wall.tokens > self.maximum:
                continue
            x = self._position(wall.tokens, width)
            while x < width - 1 and marks[x] != " ":
                x += 1
            marks[x] = wall.marker
            if wall in passed:
                mark_style[x] = "prompt-length-slider--past"
        for ch, component in zip(marks, mark_style, strict=True):
            text.append(ch, style(component))

        if self.card is None:
            text.append(
                "\nwalls appear when the engine is ready", style("prompt-length-slider--muted")
            )
            return text
        near = self.walls_near()
        for wall in walls:
            hit = wall in passed
            warn = wall in near
            component = (
                "prompt-length-slider--past"
                if hit
                else "prompt-length-slider--near"
                if warn
                else "prompt-length-slider--muted"
            )
            beyond = " (off the ruler)" if wall.tokens > self.maximum else ""
            mark = "✗" if hit else "!" if warn else " "
            text.append(
                f"\n{mark}{wall.marker} {wall.label} {wall.tokens:,}{beyond}", style(component)
            )
            if wall.note:
                text.append(f"\n   {wall.note}", style("prompt-length-slider--muted"))
        if passed:
            for line in consequences(passed):
                text.append(f"\n{line}", style("prompt-length-slider--past"))
        elif near:
            text.append(f"\n{NEAR_KV_POOL}", style("prompt-length-slider--near"))
        else:
            text.append("\nfits under every wall", style("prompt-length-slider--ok"))
        return text
