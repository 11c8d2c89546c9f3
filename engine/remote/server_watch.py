"""ServerWatch: what an attached vLLM server is doing, seen from outside.

RemoteEngine drives the requests; its ServerWatch watches the server beside them, and is
what the engine answers `features.remote` (engine.features.RemoteView) from:
- engine state from Prometheus /metrics, scraped on a thread of its own (about 5 times a
  second): the KV pool, queues, token rates, latencies;
- the prefix-cache index from vLLM's KV events (ZMQ), when the server publishes them;
- whether the server answers: when it is back after being gone, its KV events start
  again from nothing, and the engine is told (`on_back`) to read again what it serves;
- what can be shown, and why not (`capabilities`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine.errors import AuthRequired, KvscopeError, ServerUnreachable
from engine.events import RemoteCapabilities, ScrapeSample
from engine.listeners import Listeners, StepListeners
from engine.remote.client import ServerAnswer, url_host
from engine.remote.kv_event_sources import KV_EVENTS_FLAGS, NO_EVENTS, plan_sources
from engine.remote.kv_event_subscriber import KvEventSubscriber
from engine.remote.metrics import (
    CacheInfo,
    MetricsScraper,
    ScrapeState,
    ScrapeStatus,
    cache_info,
    parse_metrics,
    step_sample,
)
from engine.remote.prefix_cache_index import PrefixCacheIndex

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import PrefixCacheView, ScrapeListener, StepListener
    from engine.remote.client import ServerClient

log = logging.getLogger("kvscope")

REMOTE_LIMITS = (
    "No step boundaries are visible remotely: engine samples are /metrics scrapes "
    "(about every 200 ms), and their prefill/decode counts are the server's token counters' "
    "growth between two scrapes, not one step's split.",
    "The server sends no physical block IDs: occupancy is KV usage × total blocks, and "
    "cached blocks are known by hash from KV events.",
    "Token times are when each chunk reached this client; tokens that arrive in one chunk "
    "share one time.",
)


class ServerWatch:
    """One attached server's scrapes, KV events and capabilities, for its RemoteEngine.

    The engine attaches it (`read_pool`, `follow_kv_events`, `start_scraping`) and stops
    it. `on_pool` hears the KV pool whenever a scrape tells a different one from the last;
    `on_back` hears that the server answers again after being unreachable. Both are
    called on the scraper's thread.
    """

    def __init__(
        self,
        url: str,
        *,
        on_pool: Callable[[CacheInfo], None],
        on_back: Callable[[], None],
    ) -> None:
        self.url = url
        # Whether replies carry the server's own timings: None until a reply says. The
        # engine sets it, as only its replies can tell.
        self.server_timings: bool | None = None
        # What a server that is not vLLM's does not tell (ServerApi.notes), set at attach.
        self.api_notes: tuple[str, ...] = ()
        self._on_pool = on_pool
        self._on_back = on_back
        self._metrics_path = "/metrics"  # as attached (`read_pool`)
        self._cache: CacheInfo | None = None
        self._listeners = StepListeners()
        self._scrape_listeners: Listeners[ScrapeSample] = Listeners()
        self._scraper: MetricsScraper | None = None
        self._scrape_client: ServerClient | None = None
        self._scrape_status = ScrapeStatus(True, False, "not attached yet")
        self._bad_at_attach = 0  # /metrics samples dropped at attach (the scraper counts on)
        self._first_bad = ""
        self._last_scrape: ScrapeSample | None = None
        self._index = PrefixCacheIndex()
        self._kv: KvEventSubscriber | None = None
        self._kv_note = "not attached yet"

    @property
    def cache(self) -> CacheInfo | None:
        """The KV pool as /metrics last told it (None: it has not)."""
        return self._cache

    # -- attach and stop ---------------------------------------------------------------------
    def read_pool(self, control: ServerClient, model: str, metrics_path: str) -> ScrapeState:
        """The first scrape, at attach: the KV pool, and the state the scraper goes on from.

        Raises AuthRequired or ServerUnreachable; a /metrics that fails otherwise leaves
        the pool unknown and says why in `capabilities`.
        """
        self._metrics_path = metrics_path
        state = ScrapeState(model)
        self._scrape_status = ScrapeStatus(True, False, "")
        try:
            parsed = parse_metrics(control.text(metrics_path))
            self._bad_at_attach, self._first_bad = parsed.bad, parsed.first_bad
            self._cache = cache_info(parsed)
            if parsed.has_vllm:
                self._last_scrape = state.update(parsed, time.perf_counter(), self._cache)
                self._scrape_status = ScrapeStatus(True, True, "")
            else:
                self._scrape_status = self._metrics_missing(None)
        except (KvscopeError, ServerAnswer, ValueError, ArithmeticError) as exc:
            if isinstance(exc, AuthRequired | ServerUnreachable):
                raise
            self._cache = None
            self._scrape_status = self._classify_scrape_error(exc)
        return state

    def start_scraping(self, state: ScrapeState, client: ServerClient, interval_s: float) -> None:
        """Scrape on a thread from now on, through `client` (closed by `stop`)."""
        path = self._metrics_path
        self._scraper = MetricsScraper(
            fetch=lambda: client.text(path),
            state=state,
            on_sample=self._on_scrape,
            on_status=self._on_scrape_status,
            classify=self._classify_scrape_error,
            interval_s=interval_s,
        )
        self._scraper.status = self._scrape_status
        self._scraper.start()
        self._scrape_client = client

    def stop(self) -> None:
        """Stop the scraper and the KV-event subscriber; what they last saw is kept."""
        if self._scraper is not None:
            self._scraper.stop()
            self._scraper = None
        if self._scrape_client is not None:
            self._scrape_client.close()
            self._scrape_client = None
        if self._kv is not None:
            self._kv.stop()
            self._kv = None

    # -- engine state: /metrics --------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """StepSamples made from scrapes (see REMOTE_LIMITS): one per scrape."""
        return self._listeners.add(listener)

    def add_scrape_listener(self, listener: ScrapeListener) -> Callable[[], None]:
        """The full ScrapeSample of every scrape, from the scraper's thread."""
        return self._scrape_listeners.add(listener)

    @property
    def last_scrape(self) -> ScrapeSample | None:
        return self._last_scrape

    def _on_scrape(self, sample: ScrapeSample, cache: CacheInfo | None) -> None:
        self._last_scrape = sample
        if cache is not None and cache != self._cache:
            self._cache = cache
            self._on_pool(cache)
        self._scrape_listeners.emit(sample)
        self._listeners.emit(step_sample(sample))

    def _on_scrape_status(self, status: ScrapeStatus) -> None:
        was_reachable = self._scrape_status.reachable
        self._scrape_status = status
        if status.reachable and not was_reachable:
            # Back after being gone, perhaps restarted: its KV events start again from
            # nothing, and what it serves may have changed.
            if self._kv is not None:
                self._kv.reset()
            self._on_back()

    def _metrics_missing(self, exc: BaseException | None) -> ScrapeStatus:
        why = f" ({exc})" if exc else ""
        return ScrapeStatus(
            True,
            False,
            f"The server at {self.url} gives no vLLM metrics at {self._metrics_path}{why}, so "
            "KV usage, queues and server-side latencies cannot be shown; chat still works. "
            "vLLM serves /metrics unless a proxy hides it.",
        )

    def _classify_scrape_error(self, exc: BaseException) -> ScrapeStatus:
        if isinstance(exc, ServerUnreachable):
            return ScrapeStatus(
                False,
                False,
                f"The server at {self.url} does not answer ({exc.detail}); kvscope re-attaches "
                "when it is back.",
            )
        if isinstance(exc, AuthRequired):
            return ScrapeStatus(True, False, exc.plain())
        return self._metrics_missing(exc)

    # -- the prefix-cache index: KV events -----------------------------------------------------
    def follow_kv_events(self, control: ServerClient, setting: str | None) -> None:
        """Subscribe to the server's KV events into a fresh index.

        `setting` is RemoteEngine's `kv_events`: "auto", None (off), or an endpoint.
        """
        self._index = PrefixCacheIndex()
        if setting is None:
            self._kv_note = "KV events are off in this client. " + NO_EVENTS.split(". ", 1)[1]
            return
        if setting == "auto":
            try:
                config = control.json("GET", "/kv_event_sources")
            except (ServerAnswer, KvscopeError) as exc:
                config = {}
                log.info("kvscope: /kv_event_sources: %s", exc)
            if not isinstance(config, dict):
                config = {}
        else:
            config = {"0": {"enable_kv_cache_events": True, "endpoint": setting}}
        sources, note = plan_sources(config, url_host(self.url))
        if not sources:
            self._kv_note = note
            return
        subscriber = KvEventSubscriber(sources, self._index)
        problem = subscriber.start()
        if problem:
            self._kv_note = problem
            return
        self._kv = subscriber
        self._kv_note = ""

    def prefix_cache(self) -> PrefixCacheView:
        """The cached blocks the server reported, by hash and session; never block IDs."""
        kv = self._kv
        return self._index.view(
            replayed=kv.replayed if kv else 0,
            missed=kv.missed if kv else 0,
            receiving=kv.receiving if kv else False,
            note=self._kv_events_note(),
        )

    def _kv_events_note(self) -> str:
        kv = self._kv
        if kv is None:
            return self._kv_note
        if self._cache is not None and self._cache.prefix_caching is False:
            return (
                "The server runs without prefix caching, so it caches no blocks and sends no "
                f"KV events; start it with {KV_EVENTS_FLAGS}."
            )
        if not kv.receiving:
            size = self._cache.block_size if self._cache else 0
            fill = f" of {size} tokens" if size else ""
            return (
                "Listening for KV events; none yet. The server sends them when a prompt "
                f"fills a whole block{fill}."
            )
        blocks = len(self._index)
        return f"{blocks:,} cached blocks known from KV events (by hash; no block IDs)."

    # -- what can be shown -----------------------------------------------------------------------
    @property
    def bad_samples(self) -> tuple[int, str]:
        """/metrics samples dropped since attach, and why the first one was."""
        scraper = self._scraper
        count = self._bad_at_attach + (scraper.bad_samples if scraper else 0)
        return count, self._first_bad or (scraper.first_bad if scraper else "")

    def _bad_samples_note(self) -> str:
        count, first = self.bad_samples
        if not count:
            return ""
        s = "" if count == 1 else "s"
        return f"{count:,} bad sample{s} from /metrics dropped (the first: {first})."

    @property
    def capabilities(self) -> RemoteCapabilities:
        status = self._scrape_status
        kv = self._kv
        bad = self._bad_samples_note()
        return RemoteCapabilities(
            url=self.url,
            reachable=status.reachable,
            metrics=status.available,
            metrics_note=" ".join(n for n in (status.note, bad) if n),
            kv_events=kv is not None and kv.receiving,
            kv_events_note=self._kv_events_note(),
            server_timings=self.server_timings,
            notes=REMOTE_LIMITS + self.api_notes,
        )
