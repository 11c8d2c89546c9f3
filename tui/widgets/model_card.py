"""ModelCardView: what the engine loaded, and how big its KV cache is."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from engine.events import EngineState, ModelCard
from tui import format as fmt

if TYPE_CHECKING:
    from rich.console import RenderableType

    from engine.memory_budget import MemoryBudget


BAR_GLYPHS = {
    "weights": "W",
    "activations": "A",
    "KV pool": "K",
    "other": "o",
    "free": "·",
    # A fixed pool's remainder: vLLM's activations and CUDA graphs are in it, uncounted.
    "not counted": "·",
}


def memory_bar(budget: MemoryBudget, width: int) -> str:
    """The budget as one bar of `width` cells: W weights, A activations, K KV pool,
    o other, · free (or not counted); every known part gets at least one cell. Where the
    weights came from is in `budget.words()`, shown under the bar."""
    parts = [(name, size) for name, size in budget.parts() if size > 0]
    whole = sum(size for _, size in parts) or 1
    exact = [width * size / whole for _, size in parts]
    cells = [max(1, int(x)) for x in exact]
    # Largest remainders first, so the bar is exactly `width` cells.
    by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in by_remainder[: max(0, width - sum(cells))]:
        cells[i] += 1
    while sum(cells) > width and max(cells) > 1:
        cells[cells.index(max(cells))] -= 1
    return "".join(BAR_GLYPHS[name] * n for (name, _), n in zip(parts, cells, strict=True))


class ModelCardView(Widget):
    """The model card as a small label/value table; says "loading" until there is one."""

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    ModelCardView {
        height: auto;
        width: 1fr;
    }
    ModelCardView > .model-card--label { color: $foreground-muted; }
    ModelCardView > .model-card--value { color: $foreground; }
    ModelCardView > .model-card--emulation { color: $accent; text-style: italic; }
    ModelCardView > .model-card--muted { color: $foreground-muted; text-style: italic; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "model-card--label",
        "model-card--value",
        "model-card--emulation",
        "model-card--muted",
    }

    card: reactive[ModelCard | None] = reactive(None, layout=True)
    """The loaded model, or None while the engine starts."""
    engine_state: reactive[EngineState] = reactive[EngineState]("loading", layout=True)
    """Where the engine is in its life: what to say when there is no card."""
    memory: reactive[MemoryBudget | None] = reactive(None, layout=True)
    """Where the engine's memory went at start-up (engine.features.memory)."""

    def render(self) -> RenderableType:
        style = self.get_component_rich_style
        card = self.card
        if card is None:
            return Text(fmt.state_words(self.engine_state, "card"), style("model-card--muted"))
        table = Table.grid(padding=(0, 1))
        table.add_column(style=style("model-card--label"), no_wrap=True)
        table.add_column(style=style("model-card--value"), overflow="fold")
        table.add_row("model", card.name)
        table.add_row("dtype", f"{card.dtype} on {card.device}")
        unknown = set(card.unknown)

        def known(field: str, words: str) -> str:
            # Never a made-up 0: what the engine did not say, the card says it did not.
            return "unknown (not said by the server)" if field in unknown else words

        table.add_row(
            "max_model_len", known("max_model_len", f"{fmt.tokens(card.max_model_len)} tokens")
        )
        table.add_row("block size", known("block_size", f"{card.block_size} tokens"))
        table.add_row(
            "total blocks",
            known(
                "total_blocks",
                f"{fmt.tokens(card.total_blocks)} = {fmt.tokens(card.kv_pool_tokens)} tokens",
            ),
        )
        table.add_row(
            "KV / token",
            known(
                "kv_bytes_per_token",
                f"{fmt.size(card.kv_bytes_per_token)} ({card.kv_bytes_per_token:,} B)",
            ),
        )
        if self.memory is not None:
            table.add_row("memory", memory_bar(self.memory, 24))
            table.add_row("", self.memory.words())
        if card.scheduling:
            # On CUDA, async scheduling puts a step's tokens one batch behind its schedule.
            table.add_row("scheduling", card.scheduling)
        emu = card.emulation
        if emu is not None:
            # Both geometries side by side: the model that runs here, and the one whose
            # pool on the emulated GPU sets the walls.
            table.add_row("", Text(emu.label, style("model-card--emulation")))
            table.add_row(
                "emulated KV",
                f"{fmt.size(emu.kv_bytes_per_token)} ({emu.kv_bytes_per_token:,} B) / token",
            )
            table.add_row("emulated pool", f"{fmt.tokens(emu.pool_tokens)} tokens")
        return table
