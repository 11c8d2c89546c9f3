"""Every replica's state from its own /metrics scrapes: one row each, and an imbalance line.

The scraping and parsing are engine/remote/metrics.py's (`MetricsScraper`, `ScrapeState`):
one of each per replica. This module only keeps the latest sample and status of each, the
recent waiting counts, and turns them into rows. `FleetTracker` is fed from every
replica's scraper thread and hands out frozen `FleetState` snapshots to any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

import httpx

from engine.remote.client import auth_headers
from engine.remote.metrics import (
    CacheInfo,
    MetricsScraper,
    ScrapeState,
    ScrapeStatus,
    cache_info,
    parse_metrics,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import EngineRow, ScrapeSample
    from engine.fleet.prefix_index import FleetPrefixView
    from engine.fleet.replica_kv_events import ReplicaKvStatus
    from engine.fleet.replicas import Replica, ReplicaSet

    Fetch: TypeAlias = Callable[[Replica], str]

Health = Literal["up", "stale", "no metrics", "down", "not scraped yet"]

# A replica's scrape older than this is shown as stale: at 5 scrapes a second, a few missed.
STALE_AFTER_S = 2.0
# The waiting counts kept per replica, for "its queue grew": about 5 s at 0.2 s a scrape.
QUEUE_HISTORY = 25
# Growth smaller than this is noise, not a queue building up.
MIN_QUEUE_GROWTH = 2


@dataclass(frozen=True)
class ReplicaRow:
    """One replica at one moment, summed over its data-parallel ranks (`ranks`)."""

    name: str
    url: str
    health: Health
    note: str  # "" when up, else why not, in one sentence
    scrape_age_s: float | None  # since its last good scrape; None before one
    running: int
    waiting: int
    waiting_by_reason: tuple[tuple[str, int], ...]
    kv_usage: float  # 0..1, the mean over ranks
    prefix_cache_hit_rate: float | None  # since attach; None before any lookup
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    preemptions: int  # since attach
    ranks: tuple[EngineRow, ...]  # one per `engine` label; empty before a scrape
    restarted: bool = False

    @property
    def serving(self) -> bool:
        return self.health in ("up", "stale")

    @property
    def idle(self) -> bool:
        return self.serving and self.running == 0 and self.waiting == 0


@dataclass(frozen=True)
class Imbalance:
    """One replica's queue grew while another had nothing to do."""

    busy: str
    queue_from: int
    queue_to: int
    over_s: float
    idle: tuple[str, ...]

    def words(self) -> str:
        idle = ", ".join(self.idle)
        verb = "idles" if len(self.idle) == 1 else "idle"
        return (
            f"imbalance: {self.busy}'s queue grew {self.queue_from} → {self.queue_to} in "
            f"{self.over_s:.1f} s while {idle} {verb} (nothing running or waiting)"
        )


@dataclass(frozen=True)
class FleetState:
    """The whole fleet at one moment: the scrapes, and (from FleetEngine) how requests are
    routed, where the prefixes live and each replica's KV-event stream."""

    rows: tuple[ReplicaRow, ...]
    imbalance: Imbalance | None
    routing: str = ""  # "routing: ..." in words; "" when not known
    prefixes: FleetPrefixView | None = None  # None when no replica publishes KV events
    router_misses: int = 0  # turns sent away from the replica holding their prefix
    kv_events: tuple[ReplicaKvStatus, ...] = ()

    @property
    def up(self) -> int:
        return sum(1 for r in self.rows if r.serving)

    def row(self, name: str) -> ReplicaRow | None:
        return next((r for r in self.rows if r.name == name), None)


def _queue() -> deque[tuple[float, int]]:
    return deque(maxlen=QUEUE_HISTORY)


@dataclass
class _Replica:
    replica: Replica
    sample: ScrapeSample | None = None
    status: ScrapeStatus | None = None
    queue: deque[tuple[float, int]] = field(default_factory=_queue)  # (time, waiting)


class FleetTracker:
    """The latest scrape and status of every replica; thread-safe.

    `clock` must be the clock of ScrapeSample.time_s (perf_counter, as MetricsScraper uses).
    """

    def __init__(
        self,
        replicas: ReplicaSet,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_reachable: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.replicas = replicas
        self.clock = clock
        # Told (name, answers) when a replica stops answering or answers again: its KV
        # events are then forgotten, or replayed (engine/fleet/replica_kv_events.py).
        self.on_reachable = on_reachable
        self._lock = threading.Lock()
        self._state = {r.name: _Replica(r) for r in replicas}

    def sampled(self, name: str, sample: ScrapeSample) -> None:
        """A replica's scraper got a sample (its thread)."""
        with self._lock:
            entry = self._state[name]
            entry.sample = sample
            entry.status = ScrapeStatus(True, True, "")
            entry.queue.append((sample.time_s, sample.waiting))

    def status(self, name: str, status: ScrapeStatus) -> None:
        """A replica's scrape status changed (its thread)."""
        with self._lock:
            entry = self._state[name]
            was = entry.status.reachable if entry.status is not None else None
            entry.status = status
            if not status.reachable:
                entry.queue.clear()  # a replica that is gone has no queue to grow
        changed = (was is not False) if not status.reachable else (was is False)
        if changed and self.on_reachable is not None:
            self.on_reachable(name, status.reachable)

    def state(self) -> FleetState:
        now = self.clock()
        with self._lock:
            rows = tuple(self._row(e, now) for e in self._state.values())
            queues = {name: tuple(e.queue) for name, e in self._state.items()}
        return FleetState(rows, _imbalance(rows, queues))

    @staticmethod
    def _row(entry: _Replica, now: float) -> ReplicaRow:
        r, sample, status = entry.replica, entry.sample, entry.status
        age = now - sample.time_s if sample is not None else None
        health: Health
        if status is None and sample is None:
            health, note = "not scraped yet", ""
        elif status is not None and not status.reachable:
            health, note = "down", status.note
        elif status is not None and not status.available:
            health, note = "no metrics", status.note
        elif age is not None and age > STALE_AFTER_S:
            health, note = "stale", f"the last scrape is {age:.1f} s old"
        else:
            health, note = "up", ""
        if sample is None or health == "down":
            return ReplicaRow(
                r.name, r.url, health, note, age, 0, 0, (), 0.0, None, 0.0, 0.0, 0, ()
            )
        return ReplicaRow(
            name=r.name,
            url=r.url,
            health=health,
            note=note,
            scrape_age_s=age,
            running=sample.running,
            waiting=sample.waiting,
            waiting_by_reason=sample.waiting_by_reason,
            kv_usage=sample.kv_usage,
            prefix_cache_hit_rate=sample.prefix_cache_hit_rate,
            prompt_tokens_per_s=sample.prompt_tokens_per_s,
            generation_tokens_per_s=sample.generation_tokens_per_s,
            preemptions=sample.preemptions,
            ranks=sample.rows,
            restarted=sample.server_restarted,
        )


def _imbalance(
    rows: tuple[ReplicaRow, ...], queues: dict[str, tuple[tuple[float, int], ...]]
) -> Imbalance | None:
    """The replica whose waiting count grew most over its recent scrapes, if any replica
    idles at the same time; None when every queue is flat or nobody idles."""
    idle = tuple(r.name for r in rows if r.idle)
    if not idle:
        return None
    best: Imbalance | None = None
    for row in rows:
        history = queues.get(row.name, ())
        if not row.serving or len(history) < 2:
            continue
        low_at = min(range(len(history)), key=lambda i: (history[i][1], -i))
        (t0, low), (t1, now) = history[low_at], history[-1]
        # Measured from its lowest point, so a queue that drains again does not count.
        if now - low >= MIN_QUEUE_GROWTH:
            found = Imbalance(row.name, low, now, t1 - t0, idle)
            if best is None or now - low > best.queue_to - best.queue_from:
                best = found
    return best


# -- scraping every replica ---------------------------------------------------------------


class FleetScrapers:
    """One engine/remote MetricsScraper per replica, all feeding one FleetTracker.

    `fetch(replica)` returns that replica's /metrics text or raises; `classify` turns what
    it raised into a ScrapeStatus (RemoteEngine's rules, or `plain_classify`).
    """

    def __init__(
        self,
        tracker: FleetTracker,
        fetch: Fetch,
        *,
        classify: Callable[[Replica, BaseException], ScrapeStatus] | None = None,
        model: str | None = None,
        interval_s: float = 0.2,
        retry_s: float = 1.0,
    ) -> None:
        self.tracker = tracker
        why = classify or plain_classify
        self.scrapers: dict[str, MetricsScraper] = {}
        for replica in tracker.replicas:
            self.scrapers[replica.name] = MetricsScraper(
                fetch=_bind_fetch(fetch, replica),
                state=ScrapeState(model),
                on_sample=_bind_sample(tracker, replica.name),
                on_status=_bind_status(tracker, replica.name),
                classify=_bind_classify(why, replica),
                interval_s=interval_s,
                retry_s=retry_s,
            )

    def scrape_all_once(self) -> None:
        """One scrape of every replica, on the caller's thread (tests, a first look)."""
        for scraper in self.scrapers.values():
            scraper.scrape_once()

    def start(self) -> None:
        for scraper in self.scrapers.values():
            scraper.start()

    def stop(self) -> None:
        for scraper in self.scrapers.values():
            scraper.stop()


def _bind_fetch(fetch: Fetch, replica: Replica) -> Callable[[], str]:
    return lambda: fetch(replica)


def _bind_sample(
    tracker: FleetTracker, name: str
) -> Callable[[ScrapeSample, CacheInfo | None], None]:
    return lambda sample, _cache: tracker.sampled(name, sample)


def _bind_status(tracker: FleetTracker, name: str) -> Callable[[ScrapeStatus], None]:
    return lambda status: tracker.status(name, status)


def _bind_classify(
    classify: Callable[[Replica, BaseException], ScrapeStatus], replica: Replica
) -> Callable[[BaseException], ScrapeStatus]:
    return lambda exc: classify(replica, exc)


def plain_classify(replica: Replica, exc: BaseException) -> ScrapeStatus:
    """Unreachable for a refused or timed-out connection, else 'answers, but no metrics'."""
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return ScrapeStatus(
            False, False, f"replica {replica.name} at {replica.url} does not answer ({exc})"
        )
    return ScrapeStatus(
        True, False, f"replica {replica.name} at {replica.url} gives no vLLM metrics ({exc})"
    )


def http_fetch(
    api_key: str | None = None, *, timeout_s: float = 2.0, metrics_path: str = "/metrics"
) -> tuple[Fetch, Callable[[], None]]:
    """A fetch over one shared httpx client, and the function that closes it. Each
    replica sends its URL's own credentials if it had some, else `api_key`."""
    client = httpx.Client(timeout=timeout_s)

    def fetch(replica: Replica) -> str:
        r = client.get(
            replica.url + metrics_path, headers=auth_headers(api_key, replica.where.authorization)
        )
        r.raise_for_status()
        return r.text

    return fetch, client.close


def sample_from_text(state: ScrapeState, text: str, now: float) -> ScrapeSample:
    """One /metrics text through engine/remote's parser: for recorded text and tests."""
    parsed = parse_metrics(text)
    return state.update(parsed, now, cache_info(parsed))
