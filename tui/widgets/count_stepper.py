"""CountStepper: a small whole number changed with the arrow keys (used for concurrency)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

if TYPE_CHECKING:
    from textual import events


class CountStepper(Widget, can_focus=True):
    """`◀ 2 ▶ copies`: left/right (or -/+) step by one, home/end jump to the ends."""

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    CountStepper {
        height: 1;
        width: auto;
        padding: 0 1;
    }
    CountStepper:focus {
        background: $primary 25%;
    }
    CountStepper > .count-stepper--arrow { color: $primary; }
    CountStepper > .count-stepper--value { color: $foreground; text-style: bold; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,minus", "step(-1)", "Fewer", show=False),
        Binding("right,plus,equals_sign", "step(1)", "More", show=False),
        Binding("home", "jump(-1)", "Fewest", show=False),
        Binding("end", "jump(1)", "Most", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {"count-stepper--arrow", "count-stepper--value"}

    value: reactive[int] = reactive(1, layout=True)
    """The count, between `minimum` and `maximum`."""

    @dataclass
    class Changed(Message):
        stepper: CountStepper
        value: int

        @property
        def control(self) -> CountStepper:
            return self.stepper

    def __init__(
        self,
        value: int = 1,
        *,
        minimum: int = 1,
        maximum: int = 16,
        unit: str = "",
        units: str | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.minimum = minimum
        self.maximum = maximum
        self.unit = unit
        self.units = units or unit
        self.set_reactive(CountStepper.value, max(minimum, min(value, maximum)))

    def validate_value(self, value: int) -> int:
        return max(self.minimum, min(int(value), self.maximum))

    def watch_value(self, value: int) -> None:
        self.post_message(self.Changed(self, value))

    def action_step(self, delta: int) -> None:
        self.value += delta

    def action_jump(self, direction: int) -> None:
        self.value = self.maximum if direction > 0 else self.minimum

    def on_click(self, event: events.Click) -> None:
        self.value += -1 if event.x < 2 else 1

    def render(self) -> Text:
        arrow = self.get_component_rich_style("count-stepper--arrow")
        value = self.get_component_rich_style("count-stepper--value")
        word = self.unit if self.value == 1 else self.units
        unit = f" {word}" if word else ""
        return Text.assemble(("◀ ", arrow), (f"{self.value}", value), (" ▶", arrow), unit)
