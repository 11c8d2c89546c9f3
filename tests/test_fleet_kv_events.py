"""Each replica's KV-event stream feeds its own index in the fleet's prefix index (issue
#21, item 1): found the single-server way (`/kv_event_sources`, `plan_sources`), bounded
and counted by engine/remote's subscriber, said per replica."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from fleet_fakes import FakePublisher, stored_payload
from polling import until

from engine.fleet.fleet_state import FleetTracker
from engine.fleet.prefix_index import FleetPrefixIndex
from engine.fleet.replica_kv_events import FleetKvEvents
from engine.fleet.replicas import parse_replicas
from engine.remote.kv_event_sources import NO_EVENTS
from engine.remote.metrics import ScrapeStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from engine.fleet.replicas import Replica

REPLICAS = parse_replicas(["a=http://127.0.0.1:8001", "b=http://127.0.0.1:8002"])


WAIT_S = 10.0


@pytest.fixture
def publishers() -> Iterator[dict[str, FakePublisher]]:
    pubs = {"a": FakePublisher(), "b": FakePublisher()}
    yield pubs
    for p in pubs.values():
        p.close()


def _discover(answers: Mapping[str, Any]) -> Callable[[Replica], Mapping[str, Any] | str]:
    return lambda replica: answers[replica.name]


def test_each_replicas_events_fill_its_own_index_and_bad_ones_are_counted(
    publishers: dict[str, FakePublisher],
) -> None:
    prefixes = FleetPrefixIndex(REPLICAS)
    kv = FleetKvEvents(
        REPLICAS, prefixes, _discover({n: p.sources() for n, p in publishers.items()})
    )
    kv.start()
    try:
        assert kv.any_subscribed
        for name, pub in publishers.items():
            pub.warm(lambda name=name: prefixes.index_for(name).batches > 0)  # type: ignore[misc]
        publishers["a"].send(stored_payload([1, 11], "chat-1"))
        publishers["b"].send(stored_payload([1, 21], "chat-2"))
        publishers["b"].send(b"\xc1 not msgpack")
        publishers["b"].send_raw(b"kv", b"short")  # a sequence number that is not 8 bytes
        until(
            "both sessions",
            lambda: (
                {"chat-1", "chat-2"} <= set(prefixes.view().sessions)
                and next(s for s in kv.status() if s.name == "b").bad >= 2
            ),
            WAIT_S,
        )
        view = prefixes.view()
        assert [(c.replica, c.blocks) for c in view.where("chat-1")] == [("a", 2)]
        assert [(c.replica, c.blocks) for c in view.where("chat-2")] == [("b", 2)]
        assert view.holders[1] == ("a", "b")  # the same block hash on both: held twice
        # The batch hook counted per-session activity too (what attribution reads).
        assert prefixes.mark().by_session["b"] == {"chat-2": 2}
        status = {s.name: s for s in kv.status()}
        assert status["a"].receiving and status["a"].bad == 0
        assert status["b"].bad == 2
        assert "2 bad" in status["b"].words()
    finally:
        kv.stop()
    assert not kv.any_subscribed


def test_a_replica_without_events_or_turned_off_says_why() -> None:
    prefixes = FleetPrefixIndex(REPLICAS)
    kv = FleetKvEvents(REPLICAS, prefixes, _discover({"a": {}}), settings={"b": "off"})
    kv.start()
    status = {s.name: s for s in kv.status()}
    assert not kv.any_subscribed
    assert status["a"].note == NO_EVENTS
    assert "off for it (--replica-kv-events b=off)" in status["b"].words()
    kv.stop()


def test_a_replica_down_at_attach_is_subscribed_when_it_answers(
    publishers: dict[str, FakePublisher],
) -> None:
    answers: dict[str, Any] = {"a": "its /kv_event_sources did not answer (ConnectError)"}
    answers["b"] = {}
    prefixes = FleetPrefixIndex(REPLICAS)
    kv = FleetKvEvents(REPLICAS, prefixes, _discover(answers))
    # The scrapes say when a replica is back: the tracker tells the subscribers.
    tracker = FleetTracker(
        REPLICAS, on_reachable=lambda n, up: kv.reachable(n) if up else kv.gone(n)
    )
    kv.start()
    try:
        assert "did not answer" in kv.status()[0].note
        tracker.status("a", ScrapeStatus(False, False, "connection refused"))
        answers["a"] = publishers["a"].sources()
        tracker.status("a", ScrapeStatus(True, True, ""))
        assert kv.any_subscribed
        publishers["a"].warm(lambda: prefixes.index_for("a").batches > 0)
        publishers["a"].send(stored_payload([5, 6], "chat-9"))
        until("chat-9 on a", lambda: bool(prefixes.view().where("chat-9")), WAIT_S)
        # Down again: nothing is served from its cache, so nothing is said to be there.
        tracker.status("a", ScrapeStatus(False, False, "connection refused"))
        assert prefixes.view().where("chat-9") == ()
    finally:
        kv.stop()
