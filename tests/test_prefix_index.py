"""Where every prefix lives across replicas, and which replica served a turn."""

from __future__ import annotations

from fleet_fakes import BLOCK, batch, metrics_text, stored, stored_payload

from engine.fleet.attribution import (
    Attribution,
    attribute,
    from_headers,
    from_kv_events,
    from_router_metrics,
)
from engine.fleet.prefix_index import FleetPrefixIndex
from engine.fleet.replicas import ReplicaSet, parse_replicas
from engine.remote.kv_event_wire import KvEvent

SYSTEM = 1  # the system prompt's block: every session starts with it


def three() -> ReplicaSet:
    return parse_replicas(
        ["a=http://127.0.0.1:8001", "b=http://127.0.0.1:8002", "c=http://127.0.0.1:8003"]
    )


def test_sessions_blocks_are_found_on_the_replicas_that_hold_them() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11, 12], "chat-1")))
    fleet.apply("b", batch(stored([SYSTEM, 21], "chat-2")))
    view = fleet.view()
    (on_a,) = view.where("chat-1")
    assert (on_a.replica, on_a.blocks, on_a.tokens) == ("a", 3, 3 * BLOCK)
    assert [c.replica for c in view.where("chat-2")] == ["b"]
    assert view.where("chat-3") == ()
    assert view.holders[SYSTEM] == ("a", "b")
    assert view.holders[12] == ("a",)


def test_blocks_cached_on_several_replicas_are_duplicated_memory() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11], "chat-1")))
    fleet.apply("b", batch(stored([SYSTEM], "chat-2")))
    fleet.apply("c", batch(stored([SYSTEM], "chat-3")))
    (shared,) = fleet.view().shared()
    assert (shared.block_hash, shared.replicas) == (SYSTEM, ("a", "b", "c"))
    assert fleet.view().duplicated_tokens == 2 * BLOCK


def test_a_removed_block_is_no_longer_anywhere() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11], "chat-1")))
    fleet.apply("b", batch(stored([SYSTEM], "chat-2")))
    fleet.apply("b", batch(KvEvent(kind="BlockRemoved", block_hashes=(SYSTEM,))))
    assert fleet.view().shared() == ()
    assert fleet.view().where("chat-2") == ()


def test_raw_payloads_go_through_engine_remotes_decoder() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply_payload("c", stored_payload([5, 6], "chat-9"))
    assert [(c.replica, c.blocks) for c in fleet.view().where("chat-9")] == [("c", 2)]


def test_a_session_moved_to_a_replica_without_its_prefix_is_a_router_caused_miss() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11, 12], "chat-1")))  # turn 1 went to a
    before = fleet.before_turn("chat-1")
    # Turn 2 (the first turn, its reply, a new message: 60 tokens) went to b.
    fleet.apply("b", batch(stored([SYSTEM, 11, 12], "chat-1")))
    miss = fleet.placed("chat-1", "b", 60, before)
    assert miss.kind == "miss" and miss.router_miss
    assert miss.words() == "cache miss: prefix on a, sent to b"
    assert fleet.router_misses == (miss,)
    # Turn 3 goes to a or b: both hold it now, and either is a hit.
    hit = fleet.placed("chat-1", "b", 70, fleet.before_turn("chat-1"))
    assert hit.kind == "hit" and not hit.router_miss
    assert hit.words() == f"prefix: {3 * BLOCK} of 70 tokens cached on replica b"
    assert fleet.router_misses == (miss,)


def test_a_miss_names_every_replica_that_held_the_prefix() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11], "chat-1")))
    fleet.apply("b", batch(stored([SYSTEM, 11], "chat-1")))
    miss = fleet.placed("chat-1", "c", 40, fleet.before_turn("chat-1"))
    assert miss.words() == "cache miss: prefix on a and b, sent to c"


def test_a_first_turn_and_an_unknown_replica_say_so() -> None:
    fleet = FleetPrefixIndex(three())
    first = fleet.placed("chat-1", "a", 30, fleet.before_turn("chat-1"))
    assert first.kind == "nothing cached" and not first.router_miss
    assert first.words().startswith("prefix: 0 of 30 tokens cached")
    fleet.apply("a", batch(stored([SYSTEM], "chat-1")))
    unknown = fleet.placed("chat-1", None, 30, fleet.before_turn("chat-1"))
    assert unknown.kind == "replica unknown"
    assert "cached on a" in unknown.words() and "not known" in unknown.words()


def test_cached_tokens_never_exceed_the_prompt() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11, 12], "chat-1")))
    hit = fleet.placed("chat-1", "a", 40, fleet.before_turn("chat-1"))
    assert hit.words() == "prefix: 40 of 40 tokens cached on replica a"


# -- attribution ---------------------------------------------------------------------------
def test_kv_events_tell_which_replica_stored_the_sessions_blocks() -> None:
    fleet = FleetPrefixIndex(three())
    fleet.apply("a", batch(stored([SYSTEM, 11], "chat-1")))
    before = fleet.mark()
    fleet.apply("a", batch(stored([SYSTEM], "chat-2")))  # another session meanwhile
    fleet.apply("c", batch(stored([SYSTEM, 11, 12], "chat-1")))
    found = from_kv_events(before, fleet.mark(), "chat-1")
    assert (found.replica, found.source) == ("c", "kv events")
    assert found.words() == "served by c (KV events)"


def test_kv_events_from_two_replicas_at_once_are_not_an_answer() -> None:
    fleet = FleetPrefixIndex(three())
    before = fleet.mark()
    fleet.apply("a", batch(stored([11], "chat-1")))
    fleet.apply("b", batch(stored([11], "chat-1")))
    assert from_kv_events(before, fleet.mark(), "chat-1").replica is None
    quiet = from_kv_events(fleet.mark(), fleet.mark(), "chat-1")
    assert quiet.replica is None and "shorter than one block" in quiet.note


def _router(counts: dict[str, int]) -> str:
    """The router's Prometheus text (0.1.17's names): its other per-worker counters move
    with every request too, and must not be counted as requests."""
    lines = ["# TYPE vllm_router_processed_requests_total counter"]
    lines += [
        f'vllm_router_processed_requests_total{{worker="{url}"}} {n}' for url, n in counts.items()
    ]
    lines.append("# TYPE vllm_router_cb_outcomes_total counter")
    lines += [
        f'vllm_router_cb_outcomes_total{{worker="{url}",outcome="success"}} {n}'
        for url, n in counts.items()
    ]
    return "\n".join(lines) + "\n"


def test_the_routers_per_worker_counter_names_the_replica() -> None:
    fleet = three()
    before = _router({"http://127.0.0.1:8001": 3, "http://127.0.0.1:8002": 2})
    after = _router({"http://127.0.0.1:8001": 3, "http://127.0.0.1:8002": 3})
    found = from_router_metrics(before, after, fleet)
    assert (found.replica, found.source) == ("b", "router metrics")


def test_the_routers_counter_cannot_tell_two_requests_apart() -> None:
    fleet = three()
    before = _router({"http://127.0.0.1:8001": 3, "http://127.0.0.1:8002": 2})
    after = _router({"http://127.0.0.1:8001": 4, "http://127.0.0.1:8002": 3})
    found = from_router_metrics(before, after, fleet)
    assert found.replica is None and "2 requests in between" in found.note
    other = from_router_metrics(_router({}), _router({"http://10.0.0.9:8000": 1}), fleet).note
    assert "which is no --replica" in other
    assert "no vllm_router_processed" in from_router_metrics("", metrics_text(), fleet).note


def test_a_header_naming_a_replica_wins_and_every_reason_is_kept_otherwise() -> None:
    fleet = three()
    header = from_headers({"x-upstream": "http://127.0.0.1:8003/"}, fleet)
    kv = Attribution("a", "kv events")
    assert attribute(header, kv).replica == "c"
    assert attribute(header, kv).source == "router header"
    none = from_headers({"x-request-id": "req-1"}, fleet)
    assert attribute(none, kv) == kv
    unknown = attribute(none, Attribution(None, "none", "no KV events"))
    assert unknown.words() == (
        "served by: not known (no response header names a replica; no KV events)"
    )
