"""One row per replica from its own /metrics, a replica that goes down, and imbalance."""

from __future__ import annotations

import time

import httpx
import pytest
from fleet_fakes import FakeReplica, metrics_text
from held_clock import HeldClock

from engine.fleet.fleet_state import (
    STALE_AFTER_S,
    FleetScrapers,
    FleetTracker,
    http_fetch,
    sample_from_text,
)
from engine.fleet.replicas import Replica, ReplicaSet, parse_replicas
from engine.remote.metrics import ScrapeState


class Texts:
    """Each replica's /metrics text, changed by the test between scrapes."""

    def __init__(self, **texts: str) -> None:
        self.texts = texts
        self.down: set[str] = set()

    def __call__(self, replica: Replica) -> str:
        if replica.name in self.down:
            raise httpx.ConnectError("connection refused")
        return self.texts[replica.name]


def two() -> ReplicaSet:
    return parse_replicas(["a=http://127.0.0.1:8001", "b=http://127.0.0.1:8002"])


def test_each_replica_gets_its_own_row_from_its_own_scrape() -> None:
    texts = Texts(
        a=metrics_text(running=3, waiting=1, usage=0.5, prompt=100, queries=100, hits=40),
        b=metrics_text(running=0, waiting=0, usage=0.1),
    )
    scrapers = FleetScrapers(FleetTracker(two()), texts)
    scrapers.scrape_all_once()
    texts.texts["a"] = metrics_text(
        running=3, waiting=1, usage=0.5, prompt=300, generation=50, queries=200, hits=120
    )
    time.sleep(0.01)
    scrapers.scrape_all_once()
    state = scrapers.tracker.state()
    a, b = state.rows
    assert (a.name, a.health, a.running, a.waiting, a.kv_usage) == ("a", "up", 3, 1, 0.5)
    assert a.prefix_cache_hit_rate == pytest.approx(80 / 100)  # since attach: (120-40)/(200-100)
    assert a.prompt_tokens_per_s > 0 and a.generation_tokens_per_s > 0
    assert (b.name, b.running, b.kv_usage, b.prompt_tokens_per_s) == ("b", 0, 0.1, 0.0)
    assert b.prefix_cache_hit_rate is None
    assert state.up == 2
    assert a.scrape_age_s is not None and a.scrape_age_s < STALE_AFTER_S


def test_data_parallel_ranks_stay_visible_inside_a_row() -> None:
    texts = Texts(a=metrics_text(running=4, engines=2), b=metrics_text())
    scrapers = FleetScrapers(FleetTracker(two()), texts)
    scrapers.scrape_all_once()
    a = scrapers.tracker.state().row("a")
    assert a is not None
    assert [(r.engine, r.running) for r in a.ranks] == [("0", 2), ("1", 2)]
    assert a.running == 4


def test_a_replica_that_goes_down_shows_down_and_the_others_carry_on() -> None:
    texts = Texts(a=metrics_text(running=2), b=metrics_text(running=1))
    scrapers = FleetScrapers(FleetTracker(two()), texts)
    scrapers.scrape_all_once()
    texts.down.add("b")
    scrapers.scrape_all_once()
    state = scrapers.tracker.state()
    a, b = state.rows
    assert (a.health, a.running) == ("up", 2)
    assert (b.health, b.running) == ("down", 0)
    assert "replica b at http://127.0.0.1:8002 does not answer" in b.note
    assert state.up == 1


def test_a_replica_without_vllm_metrics_says_so() -> None:
    texts = Texts(a="# nothing here\nup 1\n", b=metrics_text())
    scrapers = FleetScrapers(FleetTracker(two()), texts)
    scrapers.scrape_all_once()
    a = scrapers.tracker.state().row("a")
    assert a is not None and a.health == "no metrics"
    assert "no vllm: metrics" in a.note


def test_an_old_scrape_is_stale_and_a_new_replica_is_not_scraped_yet() -> None:
    fleet = two()
    clock = HeldClock(100.0)
    tracker = FleetTracker(fleet, clock=clock)
    tracker.sampled("a", sample_from_text(ScrapeState(), metrics_text(running=1), 100.0))
    clock.now = 100.0 + STALE_AFTER_S + 1
    a, b = tracker.state().rows
    assert a.health == "stale" and a.running == 1 and a.serving
    assert b.health == "not scraped yet" and not b.serving


def _fed(waiting_a: list[int], running_b: int) -> FleetTracker:
    tracker = FleetTracker(two(), clock=lambda: 10.0)
    state_a, state_b = ScrapeState(), ScrapeState()
    for i, w in enumerate(waiting_a):
        t = 1.0 + i * 0.5
        tracker.sampled("a", sample_from_text(state_a, metrics_text(running=4, waiting=w), t))
        tracker.sampled("b", sample_from_text(state_b, metrics_text(running=running_b), t))
    return tracker


def test_a_queue_growing_while_another_replica_idles_is_an_imbalance() -> None:
    imbalance = _fed([0, 2, 5, 7], running_b=0).state().imbalance
    assert imbalance is not None
    assert (imbalance.busy, imbalance.queue_from, imbalance.queue_to) == ("a", 0, 7)
    assert imbalance.idle == ("b",)
    assert imbalance.words() == (
        "imbalance: a's queue grew 0 → 7 in 1.5 s while b idles (nothing running or waiting)"
    )


def test_no_imbalance_when_the_other_replica_works_or_the_queue_is_flat() -> None:
    assert _fed([0, 2, 5, 7], running_b=1).state().imbalance is None
    assert _fed([3, 3, 4, 3], running_b=0).state().imbalance is None
    assert _fed([7, 5, 2, 0], running_b=0).state().imbalance is None


def test_scrapes_over_http_carry_each_replicas_own_credentials() -> None:
    with FakeReplica("a", metrics_text(running=2)) as a, FakeReplica("b") as b:
        fleet = parse_replicas([f"a=http://alice:pw@127.0.0.1:{a.port}", b.url])
        fetch, close = http_fetch(api_key="key-b")
        scrapers = FleetScrapers(FleetTracker(fleet), fetch, interval_s=0.05)
        try:
            scrapers.start()
            deadline = time.monotonic() + 10  # 200 scrape intervals
            while time.monotonic() < deadline and scrapers.tracker.state().up < 2:
                time.sleep(0.02)
        finally:
            scrapers.stop()
            close()
        state = scrapers.tracker.state()
        assert state.up == 2, f"both replicas never scraped: {state.rows}"
        row_a = state.row("a")
        assert row_a is not None and row_a.health == "up" and row_a.running == 2
        assert a.requests[0][0] == "/metrics"
        assert a.requests[0][1]["Authorization"].startswith("Basic ")
        assert b.requests[0][1]["Authorization"] == "Bearer key-b"
