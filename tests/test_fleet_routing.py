"""Where each request of a fleet went, and where its prefix was (issue #21, items 1-3):
kvscope's own round robin when there is no router, and the replicas' KV events behind
one; the words end up in the reply's footer."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fleet_fakes import FakePublisher, FakeReplica, stored_payload
from polling import until
from remote_server import FakeRequest, FakeServer, Reply, chat_reply

from engine.events import (
    ChatMessage,
    GenerationRequest,
    ReplicaServed,
    RequestFinished,
    SamplingSettings,
    TokenEvent,
)
from engine.fleet import fleet_engine
from engine.fleet.fleet_engine import FleetEngine
from engine.fleet.replicas import parse_replicas
from engine.fleet.round_robin import RoundRobinEngine
from engine.remote import RemoteEngine
from tui.widgets.reply_footer import footer_fields

if TYPE_CHECKING:
    import pytest

    from engine.protocol import Engine


async def _ask(engine: Engine, n: int) -> tuple[str, RequestFinished]:
    request = GenerationRequest(
        f"req-{n}",
        messages=(ChatMessage("user", f"hello {n}"),),
        sampling=SamplingSettings(max_tokens=4),
    )
    text, finished = "", None
    async for ev in engine.stream(request):
        if isinstance(ev, TokenEvent):
            text += ev.text
        elif isinstance(ev, RequestFinished):
            finished = ev
    assert finished is not None
    return text, finished


WAIT_S = 15.0


def test_without_a_router_requests_alternate_and_skip_a_replica_that_is_down() -> None:
    with FakeReplica("a") as a, FakeReplica("b") as b:
        replicas = parse_replicas([f"a={a.url}", f"b={b.url}"])
        inner = RoundRobinEngine(
            [(r.name, RemoteEngine(r.where, scrape_interval_s=0.05)) for r in replicas]
        )
        fleet = FleetEngine(inner, replicas, interval_s=0.05)
        try:
            fleet.start()
            assert "kvscope's round robin over a, b (no --url router)" in fleet.routing
            assert fleet.fleet_state().routing == fleet.routing
            served = [asyncio.run(_ask(fleet, n)) for n in range(4)]
            assert [text for text, _ in served] == ["from a", "from b", "from a", "from b"]
            for (_text, ev), name in zip(served, "abab", strict=True):
                assert ev.fleet == ReplicaServed(name, f"served by {name} (kvscope's round robin)")
                assert footer_fields(ev)[-1] == f"served by {name} (kvscope's round robin)"
            b.stop()
            until("b down", lambda: fleet.fleet_state().row("b").health == "down", WAIT_S)  # type: ignore[union-attr]
            after = [asyncio.run(_ask(fleet, n)) for n in range(4, 6)]
            assert [text for text, _ in after] == ["from a", "from a"]  # a carries on
        finally:
            fleet.shutdown()


def test_behind_a_router_kv_events_say_which_replica_and_a_moved_turn_is_a_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The half-second wait for KV events made long: on a loaded host they come later, and
    # the wait ends as soon as they are in (the attribution is checked, not its speed).
    monkeypatch.setattr(fleet_engine, "KV_EVENTS_GRACE_S", 60.0)
    pubs = {"a": FakePublisher(), "b": FakePublisher()}
    # The "router" sends turn 1 to b and turn 2 to a: each replica's events say so.
    turn_to = iter(["b", "a"])

    def route(req: FakeRequest) -> Reply:
        session = req.json()["session_id"]
        pubs[next(turn_to)].send(stored_payload([1, 11], session))
        return chat_reply("Hi", ".")

    with (
        FakeServer({"/v1/chat/completions": route}) as router,
        FakeReplica("a") as a,
        FakeReplica("b") as b,
    ):
        a.kv_sources, b.kv_sources = pubs["a"].sources(), pubs["b"].sources()
        replicas = parse_replicas([f"a={a.url}", f"b={b.url}"])
        fleet = FleetEngine(
            RemoteEngine(router.url), replicas, interval_s=0.05, router_url=router.url
        )
        try:
            fleet.start()
            for name, pub in pubs.items():
                pub.warm(lambda name=name: fleet.prefixes.index_for(name).batches > 0)  # type: ignore[misc]
            assert "through the router at" in fleet.routing
            _, first = asyncio.run(_ask(fleet, 1))
            assert first.fleet is not None
            assert first.fleet.served == "served by b (KV events)"
            assert first.fleet.prefix.startswith("prefix: 0 of ")
            _, second = asyncio.run(_ask(fleet, 2))
            assert second.fleet is not None
            assert second.fleet.served == "served by a (KV events)"
            assert second.fleet.prefix == "cache miss: prefix on b, sent to a"
            fields = footer_fields(second)
            assert fields[-2:] == ("cache miss: prefix on b, sent to a", "served by a (KV events)")
            state = fleet.fleet_state()
            assert state.router_misses == 1
            assert state.prefixes is not None and state.prefixes.holders[11] == ("a", "b")
            # The Server panel's block map gets every replica's blocks.
            cache = fleet.features.remote.prefix_cache()  # type: ignore[union-attr]
            assert len(cache.blocks) == 4 and cache.receiving
            assert "across the fleet" in cache.note
            # b stops answering: its cache is no longer where the session's prefix is.
            session = fleet.inner.session_id
            assert {c.replica for c in fleet.prefixes.view().where(session)} == {"a", "b"}
            b.stop()
            until("b forgotten", lambda: len(fleet.prefixes.view().where(session)) == 1, WAIT_S)
        finally:
            fleet.shutdown()
            for pub in pubs.values():
                pub.close()


def test_a_tape_keeps_where_each_reply_was_served() -> None:
    """A replay (and --resume) shows the same footers: the words go on the tape."""
    import json

    from engine.tape.format import Decoder, Encoder

    served = ReplicaServed(
        "b", "served by b (router counter)", "prefix: 412 of 430 tokens cached on replica b"
    )
    ev = RequestFinished("r1", "stop", 430, 2, 0.1, (0.01,), 0.2, fleet=served)
    record = json.loads(json.dumps(Encoder().encode("event", ev, 1.0)))
    back, _ = Decoder().decode(record)
    assert back == ev
    assert footer_fields(back)[-2:] == (served.prefix, served.served)
