"""FleetView alone in a tiny host app, on made-up fleet data: rows, ranks, down, imbalance."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from fleet_fakes import batch, stored
from textual.app import App, ComposeResult

from engine.events import EngineRow
from engine.fleet.fleet_state import FleetState, Imbalance, ReplicaRow
from engine.fleet.prefix_index import FleetPrefixIndex, FleetPrefixView
from engine.fleet.replica_kv_events import ReplicaKvStatus
from engine.fleet.replicas import parse_replicas
from themes import all_themes
from tui.widgets import STYLESHEETS
from tui.widgets.fleet_view import FleetView

if TYPE_CHECKING:
    from pathlib import PurePath

    from textual.pilot import Pilot

SIZE = (160, 24)


def _rank(engine: str, running: int, waiting: int, usage: float) -> EngineRow:
    return EngineRow(engine, running, waiting, (), usage, 0, 256, 0, 120.0, 40.0, 0.5)


def _row(name: str, port: int, **fields: object) -> ReplicaRow:
    base: dict[str, object] = dict(
        name=name,
        url=f"http://127.0.0.1:{port}",
        health="up",
        note="",
        scrape_age_s=0.2,
        running=0,
        waiting=0,
        waiting_by_reason=(),
        kv_usage=0.0,
        prefix_cache_hit_rate=None,
        prompt_tokens_per_s=0.0,
        generation_tokens_per_s=0.0,
        preemptions=0,
        ranks=(),
    )
    base.update(fields)
    return ReplicaRow(**base)  # type: ignore[arg-type]


def made_up_fleet() -> FleetState:
    a = _row(
        "a",
        8001,
        running=4,
        waiting=7,
        waiting_by_reason=(("capacity", 7),),
        kv_usage=0.93,
        prefix_cache_hit_rate=0.81,
        prompt_tokens_per_s=1840.0,
        generation_tokens_per_s=212.0,
        preemptions=3,
        ranks=(_rank("0", 2, 4, 0.95), _rank("1", 2, 3, 0.91)),
    )
    b = _row("b", 8002, kv_usage=0.05, prefix_cache_hit_rate=0.12)
    c = _row(
        "c",
        8003,
        health="down",
        note="replica c at http://127.0.0.1:8003 does not answer (connection refused)",
        scrape_age_s=12.5,
    )
    return FleetState((a, b, c), Imbalance("a", 0, 7, 1.5, ("b",)))


def made_up_prefixes() -> FleetPrefixView:
    fleet = FleetPrefixIndex(parse_replicas(["a=h:8001", "b=h:8002", "c=h:8003"]))
    fleet.apply("a", batch(stored([1, 11, 12], "chat-1")))
    fleet.apply("b", batch(stored([1, 21], "chat-2")))
    return fleet.view()


class Host(App[None]):
    """FleetView alone, with kvscope's real stylesheets and theme."""

    CSS_PATH: ClassVar[list[str | PurePath]] = list(STYLESHEETS)

    def compose(self) -> ComposeResult:
        yield FleetView(id="fleet")

    def on_mount(self) -> None:
        for theme in all_themes():
            self.register_theme(theme)
        self.theme = "kvscope-dark"


def _lines(app: App[None]) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


ROUTING = "routing: through the router at http://127.0.0.1:8080; its counter names each replica"


def made_up_streams() -> tuple[ReplicaKvStatus, ...]:
    return (
        ReplicaKvStatus("a", True, 120, 0, 0, 0, ""),
        ReplicaKvStatus("b", True, 40, 2, 1, 0, ""),
        ReplicaKvStatus("c", False, 0, 0, 0, 0, "its /kv_event_sources did not answer"),
    )


async def _fill(pilot: Pilot[None]) -> None:
    view = pilot.app.query_one(FleetView)
    view.state = replace(made_up_fleet(), routing=ROUTING, kv_events=made_up_streams())
    view.prefixes = made_up_prefixes()
    view.router_misses = 1
    await pilot.pause()


async def test_each_replica_has_a_row_and_the_imbalance_has_a_line() -> None:
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        assert "waiting for the replicas' first /metrics scrape" in "\n".join(_lines(app))
        await _fill(pilot)
        text = "\n".join(_lines(app))
        assert "fleet: 3 replicas, 2 serving" in text
        row_a = next(line for line in _lines(app) if line.lstrip().startswith("a "))
        assert row_a.split() == [
            "a", "up", "4", "7", "(7", "capacity)", "93%", "81%", "1,840", "212", "3", "0.2",
            "s", "ago",
        ]  # fmt: skip
        assert "a/0" in text and "a/1" in text  # data-parallel ranks under their replica
        row_c = next(line for line in _lines(app) if line.lstrip().startswith("c "))
        assert row_c.split()[:2] == ["c", "down"]
        assert "c: replica c at http://127.0.0.1:8003 does not answer" in text
        assert "imbalance: a's queue grew 0 → 7 in 1.5 s while b idles" in text
        assert "1 block on several replicas" in text
        assert "1 router-caused cache miss" in text
        assert "a: 3 blocks cached (chat-1)" in text
        assert ROUTING in text
        assert "a: 120 event batches; b: 40 event batches (2 missed, 1 bad); c: its" in text


async def test_one_rank_is_no_extra_row_and_no_imbalance_is_no_line() -> None:
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(FleetView)
        b = _row("b", 8002, ranks=(_rank("0", 0, 0, 0.0),))
        view.state = FleetState((b,), None)
        await pilot.pause()
        text = "\n".join(_lines(app))
        assert "b/0" not in text
        assert "imbalance" not in text
        assert "prefixes" not in text


def test_fleet_view_snapshot(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(Host(), terminal_size=SIZE, run_before=_fill)
