"""FleetEngine: traffic through one URL (vLLM's router, or one replica) or kvscope's own
round robin, and every replica of the fleet scraped and followed beside it.

The router decides where each request goes; the replicas' own /metrics say what each one
is doing (never scraped through the router, which forwards /metrics to one worker), and
their KV-event streams say where every prefix lives (engine/fleet/replica_kv_events.py).
The engine the requests go through is the inner RemoteEngine (or RoundRobinEngine),
unchanged: its card, its streams. What the fleet adds is `features.fleet`, a remote view
whose prefix cache is every replica's, and on each RequestFinished the replica that served
it and where its prefix was (`ReplicaServed`, for the reply's footer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import TYPE_CHECKING

import httpx

from engine.delegating import DelegatingEngine
from engine.errors import BadOption, ServerUnreachable
from engine.events import PrefixCacheView, ReplicaServed, RequestFinished
from engine.fleet.attribution import (
    Attribution,
    attribute,
    from_kv_events,
    from_router_metrics,
    metrics_page_problem,
    router_counts,
)
from engine.fleet.fleet_state import FleetScrapers, FleetState, FleetTracker, http_fetch
from engine.fleet.prefix_index import FleetPrefixIndex
from engine.fleet.replica_kv_events import OFF, FleetKvEvents, http_discover
from engine.fleet.round_robin import RoundRobinEngine
from engine.remote import RemoteEngine
from engine.remote.client import describe
from engine.remote.kv_event_sources import NO_EVENTS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from engine.events import (
        EngineEvent,
        GenerationRequest,
        ModelCard,
        ProgressCallback,
        RemoteCapabilities,
        ScrapeListener,
    )
    from engine.features import EngineFeatures, RemoteView
    from engine.fleet.prefix_index import ActivityMark, SessionCache
    from engine.fleet.replicas import ReplicaSet

# How long a finished request waits for what says which replica served it: its KV events
# (published at the step that stored the blocks, so by the last token they are normally
# in; a one-token reply may beat them by a few ms), or the router's counter.
KV_EVENTS_GRACE_S = 0.5
ROUTER_METRICS_TIMEOUT_S = 1.0
ROUTER_CHECK_TIMEOUT_S = 5.0  # the one read before the run: a slow router is not a dead one


class FleetEngine(DelegatingEngine):
    """`inner` for the requests, and a scraper and KV-event subscriber per replica.

    `kv_settings` is each replica's `--replica-kv-events` ("auto", "off" or an endpoint;
    a replica not named is "auto"). `router_metrics` is the router's own Prometheus URL
    (vllm-router's --prometheus-port), read around each request to say where it went.
    """

    inner: RemoteEngine | RoundRobinEngine

    def __init__(
        self,
        inner: RemoteEngine | RoundRobinEngine,
        replicas: ReplicaSet,
        *,
        api_key: str | None = None,
        interval_s: float = 0.5,
        kv_settings: Mapping[str, str] | None = None,
        router_metrics: str | None = None,
        router_url: str | None = None,
    ) -> None:
        super().__init__(inner)
        self.replicas = replicas
        self.prefixes = FleetPrefixIndex(replicas)
        self.tracker = FleetTracker(replicas, on_reachable=self._reachable)
        self.router_metrics = router_metrics
        self.router_url = router_url
        self._api_key = api_key
        self._interval_s = interval_s
        self._kv_settings = dict(kv_settings or {})
        self._scrapers: FleetScrapers | None = None
        self._kv: FleetKvEvents | None = None
        self._closers: list[Callable[[], None]] = []
        self._router_http: httpx.Client | None = None
        self._lock = threading.Lock()  # requests stream on any event loop
        self._in_flight = 0
        self._started = 0
        if isinstance(inner, RoundRobinEngine):
            inner.healthy = self._serving
        # Each replica's events are followed here; the router publishes none (its
        # /kv_event_sources is one worker's, whose endpoint the subscriber here holds).
        remotes = [e for _, e in inner.engines] if isinstance(inner, RoundRobinEngine) else [inner]
        for remote in remotes:
            remote.kv_events_setting = None
        first = next(iter(replicas))
        if isinstance(inner, RemoteEngine) and replicas.at(inner.url) is None:
            # The router forwards /metrics to whichever worker its policy picks, and counts
            # it as a request to that worker: scraped every 0.2 s, that would be a chart
            # of a different replica each time, and a router counter no request can be
            # told by. The charts are the first replica's own (an absolute URL: the
            # client's base URL does not apply to it).
            inner.metrics_path = first.url + "/metrics"
        self.charted = first.name

    # -- what the fleet adds ----------------------------------------------------------------
    @property
    def features(self) -> EngineFeatures:
        inner = self.inner.features
        remote = FleetRemoteView(self, inner.remote) if inner.remote is not None else None
        return dataclasses.replace(inner, fleet=self, remote=remote)

    @property
    def routing(self) -> str:
        """How requests reach the replicas, in words for the fleet view."""
        if isinstance(self.inner, RoundRobinEngine):
            return self.inner.routing_words()
        where = self.router_url or self.inner.url
        replica = self.replicas.at(where)
        if replica is not None:
            return f"routing: every request to replica {replica.name} (--url is that replica)"
        how = (
            "its counter names each request's replica"
            if self.router_metrics
            else "KV events name each request's replica (add --router-metrics for its counter)"
        )
        return (
            f"routing: through the router at {where}; {how}; the charts are replica "
            f"{self.charted}'s"
        )

    def fleet_state(self) -> FleetState:
        state = self.tracker.state()
        kv = self._kv
        statuses = kv.status() if kv is not None else ()
        prefixes = self.prefixes.view() if kv is not None and kv.any_subscribed else None
        return dataclasses.replace(
            state,
            routing=self.routing,
            prefixes=prefixes,
            router_misses=self.prefixes.router_miss_count,
            kv_events=statuses,
        )

    def fleet_prefix_cache(self) -> PrefixCacheView:
        """Every replica's cached blocks in one view, for the Server panel's block map."""
        view = self.prefixes.view()
        parts = [(name, v) for name, v in view.replicas]
        blocks = tuple(b for _, v in parts for b in v.blocks)
        each = ", ".join(f"{name} {len(v.blocks):,}" for name, v in parts)
        receiving = any(v.receiving for _, v in parts)
        kv = self._kv
        statuses = kv.status() if kv is not None else ()
        if receiving:
            note = (
                f"{len(blocks):,} cached blocks across the fleet, from each replica's KV "
                f"events ({each}); by hash, no block IDs."
            )
        elif statuses and all(s.publishes_none for s in statuses):
            note = "No replica publishes KV events. " + NO_EVENTS.split(". ", 1)[1]
        elif kv is None:
            note = "KV events are off for every replica in this client."
        else:
            note = "No replica's KV events yet (each one's in the fleet view)."
        return PrefixCacheView(
            blocks=blocks,
            stored_total=sum(v.stored_total for _, v in parts),
            reused_total=sum(v.reused_total for _, v in parts),
            removed_total=sum(v.removed_total for _, v in parts),
            cleared=sum(v.cleared for _, v in parts),
            batches=sum(v.batches for _, v in parts),
            replayed=0,
            missed=sum(s.missed for s in statuses),
            receiving=receiving,
            note=note,
        )

    def _serving(self, name: str) -> bool:
        row = self.tracker.state().row(name)
        return row is None or row.health in ("up", "stale", "not scraped yet", "no metrics")

    def _reachable(self, name: str, answers: bool) -> None:
        kv = self._kv
        if kv is None:
            return
        if answers:
            kv.reachable(name)
        else:
            kv.gone(name)

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        try:
            card = self.inner.start(progress)
        except ServerUnreachable as exc:
            raise self._replica_down(exc) from exc
        self.check_router_metrics()
        self.watch()
        return card

    def _replica_down(self, exc: ServerUnreachable) -> ServerUnreachable:
        """A start that failed at a replica (the router's engine reads the charted
        replica's /metrics) says which replica, and that the router answered."""
        replica = self.replicas.at(exc.url)
        router = self.router_url or getattr(self.inner, "url", None)
        if replica is None or router is None or replica.url == router:
            return exc
        return ServerUnreachable(
            exc.url,
            f"{exc.detail}; it is replica {replica.name}, whose /metrics feed the charts; "
            f"the router at {router} answered",
        )

    def check_router_metrics(self) -> None:
        """`router_metrics` read once before any request. A dead address, an error status
        or a page that is not Prometheus text (/v1/models) would otherwise pass for a
        counter in use and name no replica, request after request. Raises BadOption."""
        url = self.router_metrics
        if not url:
            return
        flag = "--router-metrics"
        try:
            with httpx.Client(timeout=ROUTER_CHECK_TIMEOUT_S) as client:
                reply = client.get(url)
        except httpx.HTTPError as exc:
            raise BadOption(
                flag,
                f"{url} does not answer ({describe(exc)}); give the router's Prometheus "
                "endpoint (vllm-router --prometheus-port), e.g. http://127.0.0.1:29000/metrics",
            ) from None
        if reply.status_code != 200:
            raise BadOption(
                flag, f"{url} answered HTTP {reply.status_code}, not a Prometheus metrics page"
            )
        problem = metrics_page_problem(reply.text)
        if problem is not None:
            raise BadOption(flag, f"{url} is not a Prometheus metrics page: {problem}")

    def watch(self) -> None:
        """Start scraping and following every replica (once; `start` does it)."""
        if self._scrapers is not None:
            return
        fetch, close = http_fetch(self._api_key)
        self._closers.append(close)
        if any(self._kv_settings.get(n, "auto") != OFF for n in self.replicas.names):
            discover, close_discover = http_discover(self._api_key)
            self._closers.append(close_discover)
            self._kv = FleetKvEvents(
                self.replicas, self.prefixes, discover, settings=self._kv_settings
            )
            self._kv.start()
        if self.router_metrics:
            self._router_http = httpx.Client(timeout=ROUTER_METRICS_TIMEOUT_S)
            self._closers.append(self._router_http.close)
        self._scrapers = FleetScrapers(self.tracker, fetch, interval_s=self._interval_s)
        self._scrapers.start()

    def shutdown(self) -> None:
        if self._scrapers is not None:
            self._scrapers.stop()
            self._scrapers = None
        if self._kv is not None:
            self._kv.stop()
            self._kv = None
        for close in self._closers:
            close()
        self._closers.clear()
        self._router_http = None
        self.inner.shutdown()

    # -- each request: which replica served it, and where its prefix was -------------------
    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        return self._stream(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        session = self.inner.session_id
        before = self.prefixes.before_turn(session)
        mark = self.prefixes.mark()
        with self._lock:
            self._in_flight += 1
            self._started += 1
            alone, started = self._in_flight == 1, self._started
        try:
            # With others in flight no counter can tell this one apart: not read at all.
            counters = await self._router_counters() if alone else None
            async for event in self.inner.stream(request):
                if isinstance(event, RequestFinished):
                    with self._lock:
                        # Alone from start to end: no other request began meanwhile.
                        alone = alone and self._started == started
                    event = await self._served(event, session, before, mark, counters, alone)
                yield event
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _router_counters(self) -> str | None:
        client, url = self._router_http, self.router_metrics
        if client is None or url is None:
            return None

        def get() -> str | None:
            try:
                return client.get(url).text
            except httpx.HTTPError:
                return None

        return await asyncio.to_thread(get)

    async def _served(
        self,
        ev: RequestFinished,
        session: str,
        before: tuple[SessionCache, ...],
        mark: ActivityMark,
        counters: str | None,
        alone: bool,
    ) -> RequestFinished:
        """`alone`: no other request ran beside it, so counters and events can be waited
        for; under load nothing waits (a bench's timings and slots stay its own), and a
        reply's replica is known from round robin, or from KV events already in."""
        answers: list[Attribution] = []
        if isinstance(self.inner, RoundRobinEngine):
            answers.append(self.inner.attribution(ev.request_id))
        if counters is not None and alone:
            answers.append(await self._from_router(counters))
        following = self._kv is not None and self._kv.any_subscribed
        if following and not any(a.replica for a in answers):
            answers.append(await self._from_kv_events(mark, session, wait=alone))
        found = attribute(*answers) if answers else Attribution(None, "none", "")
        placement = self.prefixes.placed(
            session, found.replica, ev.prompt_tokens, before, ev.cached_prompt_tokens
        )
        # Where the prefix was needs the KV events (or the serving replica's own count).
        known = following or (found.replica is not None and ev.cached_prompt_tokens is not None)
        served = ReplicaServed(found.replica, found.words(), placement.words() if known else "")
        return dataclasses.replace(ev, fleet=served)

    async def _from_router(self, before: str) -> Attribution:
        """The router's counter, read again until it has counted this request: vllm-router
        counts a streamed request a moment after its last chunk has gone out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KV_EVENTS_GRACE_S
        while True:
            after = await self._router_counters()
            if after is None:
                return Attribution(None, "none", "the router's metrics did not answer")
            counted = sum(router_counts(after).values()) > sum(router_counts(before).values())
            if counted or loop.time() >= deadline:
                return from_router_metrics(before, after, self.replicas)
            await asyncio.sleep(0.05)

    async def _from_kv_events(self, mark: ActivityMark, session: str, *, wait: bool) -> Attribution:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (KV_EVENTS_GRACE_S if wait else 0.0)
        while True:
            found = from_kv_events(mark, self.prefixes.mark(), session)
            if found.replica is not None or loop.time() >= deadline:
                return found
            await asyncio.sleep(0.05)


class FleetRemoteView:
    """The inner engine's remote view, with every replica's KV events in place of its own:
    the router publishes none, and the replicas' own subscribers hold their endpoints."""

    def __init__(self, fleet: FleetEngine, inner: RemoteView) -> None:
        self._fleet = fleet
        self._inner = inner

    @property
    def capabilities(self) -> RemoteCapabilities:
        caps = self._inner.capabilities
        view = self._fleet.fleet_prefix_cache()
        return dataclasses.replace(caps, kv_events=view.receiving, kv_events_note=view.note)

    def add_scrape_listener(self, listener: ScrapeListener) -> Callable[[], None]:
        return self._inner.add_scrape_listener(listener)

    def prefix_cache(self) -> PrefixCacheView:
        return self._fleet.fleet_prefix_cache()

    def new_session(self, session_id: str | None = None) -> str:
        return self._fleet.inner.new_session(session_id)
