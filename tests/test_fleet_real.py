"""kvscope on a real fleet: two CPU vLLM servers behind vllm-router (tests/real_fleet.py,
one per session). Few tests, since each costs CI minutes; the kill is the last.

- the fleet view's rows come from the replicas' own scrapes;
- the cross-replica prefix index, from the replicas' real KV events, finds a chat's
  second turn cached on the replica that served the first;
- a replica killed mid-run shows as down, and the other carries on.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from polling import until
from rich.console import Console
from test_fleet_view import Host

from bench.records import request_record
from cli.generate import print_result
from engine.events import (
    ChatMessage,
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    TokenEvent,
)
from engine.fleet import fleet_engine
from engine.fleet.fleet_engine import FleetEngine
from engine.fleet.replicas import parse_replicas
from engine.remote import RemoteEngine
from tui.widgets.fleet_view import FleetView

if TYPE_CHECKING:
    from collections.abc import Iterator

    from real_fleet import RealFleet

# Past two blocks of 32 tokens once the chat template is applied: turn 1 stores blocks.
FIRST = (
    "Here is a short note about caches. A prefix cache keeps the keys and values of a "
    "prompt's leading tokens so that a later prompt starting the same way skips that "
    "work. Please answer in one word: is that useful?"
)
SECOND = "And in one word again: does a router decide where it helps?"


@pytest.fixture(autouse=True)
def _patient_attribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished request waits at most half a second for the router's counter or the
    KV events that say which replica served it; a loaded host's router counts later than
    that. Here the wait is long (it ends as soon as the answer is in): these tests check
    the attribution, not how quickly a busy router counts."""
    monkeypatch.setattr(fleet_engine, "KV_EVENTS_GRACE_S", 60.0)


@pytest.fixture(scope="module")
def fleet(real_fleet: RealFleet) -> Iterator[FleetEngine]:
    """kvscope attached as `--url ROUTER --replica a=... --replica b=... --router-metrics`."""
    router = real_fleet.router
    engine = FleetEngine(
        RemoteEngine(router.url),
        parse_replicas(real_fleet.replica_flags),
        interval_s=0.2,
        router_metrics=router.metrics_url,
        router_url=router.url,
    )
    engine.start()
    yield engine
    engine.shutdown()


WAIT_S = 20.0


async def _ask(
    engine: FleetEngine, rid: str, *messages: ChatMessage
) -> tuple[str, RequestFinished]:
    request = GenerationRequest(rid, messages=messages, sampling=SamplingSettings(max_tokens=6))
    text, finished = "", None
    async for ev in engine.stream(request):
        if isinstance(ev, RequestFinished):
            finished = ev
        elif isinstance(ev, TokenEvent):
            text += ev.text
    assert finished is not None
    return text, finished


async def test_fleet_view_rows_come_from_each_replicas_own_scrapes(fleet: FleetEngine) -> None:
    until("both replicas scraped", lambda: fleet.fleet_state().up == 2, WAIT_S)
    state = fleet.fleet_state()
    for row in state.rows:
        assert row.health == "up", row
        assert len(row.ranks) == 1  # one engine each, its own `engine="0"` label
        assert 0.0 <= row.kv_usage <= 1.0
        assert row.ranks[0].total_blocks > 0  # the pool from the replica's cache_config_info
    assert state.routing.startswith("routing: through the router at")
    app = Host()
    async with app.run_test(size=(160, 24)) as pilot:
        view = app.query_one(FleetView)
        view.state = state
        await pilot.pause()
        console = Console(width=160, record=True)
        console.print(view.render())
        shown = console.export_text()
    assert "fleet: 2 replicas, 2 serving" in shown
    assert all(
        any(line.split()[:2] == [name, "up"] for line in shown.splitlines()) for name in "ab"
    ), shown


async def test_a_chats_second_turn_is_found_cached_on_the_replica_that_served_the_first(
    fleet: FleetEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    session = fleet.inner.new_session("fleet-real-chat")
    user1 = ChatMessage("user", FIRST)
    reply1, first = await _ask(fleet, "turn-1", user1)
    assert first.fleet is not None and first.fleet.replica in ("a", "b"), first.fleet
    served1 = first.fleet.replica
    assert first.fleet.served == f"served by {served1} (router counter)"
    # Turn 1's blocks, from served1's own KV events (a moment behind the reply, at most).
    until("turn 1's blocks", lambda: bool(fleet.prefixes.view().where(session)), WAIT_S)
    before = fleet.prefixes.before_turn(session)
    assert [c.replica for c in before] == [served1], before
    assert before[0].tokens >= 32  # at least one whole block of the first turn's prompt
    _, second = await _ask(
        fleet,
        "turn-2",
        user1,
        ChatMessage("assistant", reply1),
        ChatMessage("user", SECOND),
    )
    assert second.fleet is not None and second.fleet.replica in ("a", "b"), second.fleet
    served2 = second.fleet.replica
    print(f"\nturn 1 on {served1}, turn 2 on {served2}: {second.fleet.prefix}")
    if served2 == served1:
        assert second.fleet.prefix.endswith(f"tokens cached on replica {served1}")
    else:  # round robin moved the chat: the prefix stayed behind
        assert second.fleet.prefix == f"cache miss: prefix on {served1}, sent to {served2}"
        assert fleet.fleet_state().router_misses >= 1
    # `kvscope generate` writes the footer's words into its JSON and under its timings.
    record = request_record(second)
    assert record["fleet"]["replica"] == served2
    capsys.readouterr()
    print_result(record, as_json=False)
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"{second.fleet.prefix}; served by {served2} (router counter)"
    )


def test_a_killed_replica_shows_down_and_the_other_carries_on(
    real_fleet: RealFleet, fleet: FleetEngine
) -> None:
    real_fleet.kill("a")
    until("a down", lambda: fleet.fleet_state().row("a").health == "down", WAIT_S)  # type: ignore[union-attr]
    state = fleet.fleet_state()
    assert state.row("b").health == "up"  # type: ignore[union-attr]
    assert "does not answer" in state.row("a").note  # type: ignore[union-attr]
    assert state.up == 1
    # The router takes a out of its rotation after a failed health check (1 s here);
    # until then a request sent to a fails, and is asked again.
    deadline = time.monotonic() + 30
    while True:
        try:
            _, done = asyncio.run(
                _ask(fleet, f"after-{time.monotonic()}", ChatMessage("user", "Hi"))
            )
        except Exception:
            assert time.monotonic() < deadline, "no request got through after the kill"
            time.sleep(1)
            continue
        if done.reason != "abort":
            break
    assert done.fleet is not None and done.fleet.replica == "b", done.fleet
