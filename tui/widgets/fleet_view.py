"""FleetView: every replica of a fleet in one table, and the line that says it is unbalanced.

One row per replica from its own /metrics (engine/fleet/fleet_state.py), with a row under
it per data-parallel rank when it has several; a replica that is down keeps its row and
says why below the table. Above it, how requests are routed (the router, or kvscope's
round robin); below it, each replica's KV-event stream, and from the prefix view how many
tokens sit cached on more than one replica, how many turns the router sent away from their
prefix, and each replica's sessions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui import format as fmt

if TYPE_CHECKING:
    from engine.events import EngineRow
    from engine.fleet.fleet_state import FleetState, ReplicaRow
    from engine.fleet.prefix_index import FleetPrefixView

COLUMNS = ("replica", "health", "run", "wait", "KV", "hits", "in/s", "out/s", "pre", "scrape")


def _age(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds:.1f} s ago"


class FleetView(Widget):
    """The fleet's replicas, one row each, and an imbalance line when there is one."""

    DEFAULT_CSS = """
    FleetView {
        height: auto;
    }
    FleetView > .fleet-view--label {
        color: $text-muted;
    }
    FleetView > .fleet-view--muted {
        color: $text-muted;
        text-style: italic;
    }
    FleetView > .fleet-view--warning {
        color: $warning;
    }
    FleetView > .fleet-view--down {
        color: $error;
    }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fleet-view--label",
        "fleet-view--muted",
        "fleet-view--warning",
        "fleet-view--down",
    }

    state: reactive[FleetState | None] = reactive(None, layout=True)
    """The fleet's latest state, or None before the first scrape of any replica."""
    prefixes: reactive[FleetPrefixView | None] = reactive(None, layout=True)
    """Where every prefix lives, from the replicas' KV events; None if none publish them."""
    router_misses: reactive[int] = reactive(0)
    """Turns sent to a replica without their session's prefix while another had it."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)

    def _health(self, row: ReplicaRow) -> Text:
        style = self.get_component_rich_style
        if row.health == "down":
            return Text("down", style("fleet-view--down"))
        if row.health in ("stale", "no metrics"):
            return Text(row.health, style("fleet-view--warning"))
        return Text(row.health)

    @staticmethod
    def _rank_cells(replica: str, rank: EngineRow) -> list[str | Text]:
        return [
            f"  {replica}/{rank.engine}",
            "",
            str(rank.running),
            fmt.waiting(rank.waiting_by_reason, rank.waiting),
            f"{rank.kv_usage:.0%}",
            fmt.percent(rank.prefix_cache_hit_rate),
            f"{rank.prompt_tokens_per_s:,.0f}",
            f"{rank.generation_tokens_per_s:,.0f}",
            str(rank.preemptions),
            "",
        ]

    def render(self) -> RenderableType:
        style = self.get_component_rich_style
        state = self.state
        if state is None:
            return Text(
                "waiting for the replicas' first /metrics scrape…", style("fleet-view--muted")
            )
        parts: list[RenderableType] = [
            Text(
                f"fleet: {fmt.count(len(state.rows), 'replica')}, {state.up} serving",
                style("fleet-view--label"),
            )
        ]
        if state.routing:
            parts.append(Text(state.routing, style("fleet-view--muted")))
        table = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
        for column in COLUMNS:
            left = column in ("replica", "health")
            table.add_column(column, justify="left" if left else "right", no_wrap=True)
        for row in state.rows:
            if not row.serving:
                table.add_row(row.name, self._health(row), *[""] * 7, _age(row.scrape_age_s))
                continue
            table.add_row(
                row.name,
                self._health(row),
                str(row.running),
                fmt.waiting(row.waiting_by_reason, row.waiting),
                f"{row.kv_usage:.0%}",
                fmt.percent(row.prefix_cache_hit_rate),
                f"{row.prompt_tokens_per_s:,.0f}",
                f"{row.generation_tokens_per_s:,.0f}",
                str(row.preemptions),
                _age(row.scrape_age_s),
            )
            if len(row.ranks) > 1:
                for rank in row.ranks:
                    table.add_row(*self._rank_cells(row.name, rank))
        parts.append(table)
        if state.imbalance is not None:
            parts.append(Text(state.imbalance.words(), style("fleet-view--warning")))
        for row in state.rows:
            if row.note:
                parts.append(Text(f"{row.name}: {row.note}", style("fleet-view--muted")))
        events = [k for k in state.kv_events if k.receiving or k.note]
        if events:
            parts.append(
                Text.assemble(
                    ("KV events ", style("fleet-view--label")),
                    ("; ".join(k.words() for k in events), style("fleet-view--muted")),
                )
            )
        prefixes = self.prefixes or state.prefixes
        misses = max(self.router_misses, state.router_misses)
        if prefixes is not None:
            shared = prefixes.shared()
            parts.append(
                Text.assemble(
                    ("prefixes ", style("fleet-view--label")),
                    f"{fmt.count(len(prefixes.sessions), 'session')} cached; "
                    f"{fmt.count(len(shared), 'block')} on several replicas "
                    f"({prefixes.duplicated_tokens:,} tokens held twice or more); "
                    + fmt.count(misses, "router-caused cache miss", "router-caused cache misses"),
                )
            )
            for name, view in prefixes.replicas:
                sessions = sorted(
                    (
                        s
                        for s, where in prefixes.sessions.items()
                        if any(c.replica == name for c in where)
                    )
                )
                who = ", ".join(sessions) if sessions else "no session"
                parts.append(
                    Text(
                        f"  {name}: {fmt.count(len(view.blocks), 'block')} cached ({who})",
                        style("fleet-view--muted"),
                    )
                )
        return Group(*parts)
