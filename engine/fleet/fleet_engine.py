"""FleetEngine: traffic through one URL (vLLM's router, or one replica), and every replica
of the fleet scraped beside it.

The router decides where each request goes; the replicas' own /metrics say what each one
is doing (never scraped through the router, which forwards /metrics to one worker). The
engine the requests go through is the inner RemoteEngine, unchanged: its card, its
streams, its Server panel. What the fleet adds is `features.fleet`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from engine.delegating import DelegatingEngine
from engine.fleet.fleet_state import FleetScrapers, FleetState, FleetTracker, http_fetch

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import ModelCard, ProgressCallback
    from engine.features import EngineFeatures
    from engine.fleet.replicas import ReplicaSet
    from engine.protocol import Engine


class FleetEngine(DelegatingEngine):
    """`inner` for the requests, and a scraper per replica while it runs."""

    def __init__(
        self,
        inner: Engine,
        replicas: ReplicaSet,
        *,
        api_key: str | None = None,
        interval_s: float = 0.5,
    ) -> None:
        super().__init__(inner)
        self.replicas = replicas
        self.tracker = FleetTracker(replicas)
        self._api_key = api_key
        self._interval_s = interval_s
        self._scrapers: FleetScrapers | None = None
        self._close: Callable[[], None] | None = None

    @property
    def features(self) -> EngineFeatures:
        return replace(self.inner.features, fleet=self)

    def fleet_state(self) -> FleetState:
        return self.tracker.state()

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        card = self.inner.start(progress)
        self.watch()
        return card

    def watch(self) -> None:
        """Start scraping every replica (once; `start` does it)."""
        if self._scrapers is not None:
            return
        fetch, self._close = http_fetch(self._api_key)
        self._scrapers = FleetScrapers(self.tracker, fetch, interval_s=self._interval_s)
        self._scrapers.start()

    def shutdown(self) -> None:
        if self._scrapers is not None:
            self._scrapers.stop()
            self._scrapers = None
        if self._close is not None:
            self._close()
            self._close = None
        self.inner.shutdown()
