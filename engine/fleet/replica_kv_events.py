"""Every replica's KV-event stream, each feeding its own index in the fleet's prefix index.

One engine/remote `KvEventSubscriber` per replica that publishes events, found the way
the single-server attach finds one (`GET /kv_event_sources` on the replica, then
`plan_sources`), or given by `--replica-kv-events NAME=ENDPOINT`. Each fills
`FleetPrefixIndex.index_for(name)` and counts per-session activity through
`batch_hook(name)`. What bounds one server's stream bounds each replica's (frame size and
queue: engine/remote/kv_event_subscriber.py; hashes per event: kv_event_wire.py; index
size: prefix_cache_index.py); the drops are counted per replica and said in the fleet view.

A replica that did not answer at attach is asked again when its scrapes come back
(`reachable`), and one that comes back after being down is replayed from scratch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from engine.errors import BadOption
from engine.remote.client import auth_headers, url_host
from engine.remote.kv_event_sources import NO_EVENTS, plan_sources
from engine.remote.kv_event_subscriber import KvEventSubscriber

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from engine.fleet.prefix_index import FleetPrefixIndex
    from engine.fleet.replicas import Replica, ReplicaSet

    Discover = Callable[[Replica], "Mapping[str, Any] | str"]
    """A replica's `/kv_event_sources` answer, or a sentence saying why there is none."""

OPTION = "--replica-kv-events"
NO_SOURCES = "it has no /kv_event_sources, so it says nothing of KV events (a vLLM before 0.11?)"
# In the fleet view's one line, a replica without events says so in two words; the how-to
# (engine/remote's NO_EVENTS) is said once, in the Server panel's note.
PUBLISHES_NONE = "publishes none"
AUTO = "auto"
OFF = "off"
_SCHEMES = ("tcp://", "ipc://")


def parse_kv_settings(texts: Sequence[str], replicas: ReplicaSet) -> dict[str, str]:
    """`--replica-kv-events NAME=ENDPOINT|off` values: name -> endpoint, "off" or "auto".

    Every replica not named is "auto". Refused in words: a name that is no replica, one
    named twice, and an endpoint that is neither tcp:// nor ipc://.
    """
    settings = dict.fromkeys(replicas.names, AUTO)
    given: set[str] = set()
    for text in texts:
        name, eq, endpoint = text.strip().partition("=")
        name, endpoint = name.strip(), endpoint.strip()
        if not eq or not name or not endpoint:
            raise BadOption(OPTION, f"{text!r} is not NAME=ENDPOINT (e.g. a=tcp://127.0.0.1:5557)")
        if replicas.named(name) is None:
            known = ", ".join(replicas.names)
            raise BadOption(OPTION, f"{name!r} is no --replica (the replicas are {known})")
        if name in given:
            raise BadOption(OPTION, f"replica {name!r} is given twice")
        if endpoint not in (OFF, AUTO) and not endpoint.startswith(_SCHEMES):
            raise BadOption(
                OPTION,
                f"{endpoint[:60]!r} for {name} is no ZMQ endpoint: give tcp://HOST:PORT, "
                "ipc://PATH, 'auto' or 'off'",
            )
        given.add(name)
        settings[name] = endpoint
    return settings


@dataclass(frozen=True)
class ReplicaKvStatus:
    """One replica's KV-event stream: whether it flows, and what was dropped."""

    name: str
    receiving: bool
    batches: int
    missed: int  # batches lost in a gap no replay could fill
    bad: int  # messages that were no event batch, and events dropped from good ones
    dropped: int  # connections ZMQ closed over an oversized frame (dialled again)
    note: str  # "" when events flow; else why there are none

    @property
    def publishes_none(self) -> bool:
        return self.note in (NO_EVENTS, NO_SOURCES)

    def words(self) -> str:
        if not self.receiving:
            if self.publishes_none:
                return f"{self.name}: {PUBLISHES_NONE}"
            return f"{self.name}: {self.note}" if self.note else f"{self.name}: no KV events yet"
        lost = [
            f"{n:,} {what}"
            for n, what in (
                (self.missed, "missed"),
                (self.bad, "bad"),
                (self.dropped, "dropped connections"),
            )
            if n
        ]
        extra = f" ({', '.join(lost)})" if lost else ""
        return f"{self.name}: {self.batches:,} event batches{extra}"


def http_discover(
    api_key: str | None = None, *, timeout_s: float = 2.0
) -> tuple[Discover, Callable[[], None]]:
    """Ask each replica's `/kv_event_sources` over one client; and how to close it."""
    client = httpx.Client(timeout=timeout_s)

    def discover(replica: Replica) -> Mapping[str, Any] | str:
        try:
            r = client.get(
                replica.url + "/kv_event_sources",
                headers=auth_headers(api_key, replica.where.authorization),
            )
        except httpx.HTTPError as exc:
            return f"its /kv_event_sources did not answer ({type(exc).__name__})"
        if r.status_code == 404:
            return NO_SOURCES
        if r.status_code >= 300:
            return f"its /kv_event_sources answered HTTP {r.status_code}"
        try:
            config = r.json()
        except ValueError:
            return "its /kv_event_sources answered no JSON"
        return config if isinstance(config, dict) else "its /kv_event_sources is no JSON object"

    return discover, client.close


class _One:
    def __init__(self, replica: Replica, setting: str) -> None:
        self.replica = replica
        self.setting = setting
        self.subscriber: KvEventSubscriber | None = None
        self.note = "not attached yet"
        self.asked = False  # an answer came (even "none published"): not asked again
        self.busy = False  # being asked now, on some thread


class FleetKvEvents:
    """A KvEventSubscriber per replica that publishes events, feeding `prefixes`."""

    def __init__(
        self,
        replicas: ReplicaSet,
        prefixes: FleetPrefixIndex,
        discover: Discover,
        *,
        settings: Mapping[str, str] | None = None,
        replay_timeout_s: float = 3.0,
    ) -> None:
        self.prefixes = prefixes
        self._discover = discover
        self._replay_timeout_s = replay_timeout_s
        chosen = settings or {}
        self._replicas = {r.name: _One(r, chosen.get(r.name, AUTO)) for r in replicas}
        self._lock = threading.Lock()  # attach/stop from the caller and the scrapers' threads
        self._stopped = False

    def start(self) -> None:
        for name in self._replicas:
            self.attach(name)

    def attach(self, name: str) -> None:
        """Find replica `name`'s publisher and subscribe, unless done or it is off."""
        with self._lock:
            one = self._replicas[name]
            if self._stopped or one.subscriber is not None or one.asked or one.busy:
                return
            if one.setting == OFF:
                one.note = f"KV events are off for it ({OPTION} {name}=off)"
                one.asked = True
                return
            one.busy = True  # the HTTP question is asked outside the lock
        try:
            self._attach(one)
        finally:
            with self._lock:
                one.busy = False

    def _attach(self, one: _One) -> None:
        config: Mapping[str, Any] | str
        if one.setting == AUTO:
            config = self._discover(one.replica)
        else:
            config = {"0": {"enable_kv_cache_events": True, "endpoint": one.setting}}
        if isinstance(config, str):
            one.note = config  # it did not answer: asked again when it does
            return
        one.asked = True
        sources, note = plan_sources(config, url_host(one.replica.url))
        if not sources:
            one.note = note
            return
        name = one.replica.name
        subscriber = KvEventSubscriber(
            sources,
            self.prefixes.index_for(name),
            replay_timeout_s=self._replay_timeout_s,
            on_batch=self.prefixes.batch_hook(name),
        )
        problem = subscriber.start()
        if problem:
            one.note = problem
            return
        with self._lock:
            late = self._stopped  # stopped while it was being found
            if not late:
                one.subscriber = subscriber
                one.note = ""
        if late:
            subscriber.stop()

    def reachable(self, name: str) -> None:
        """Replica `name` answers again after being down: its cache is what it holds now
        (empty if it restarted), so forget it and replay; or subscribe at last."""
        with self._lock:
            subscriber = self._replicas[name].subscriber
        if subscriber is None:
            self.attach(name)
            return
        subscriber.reset()

    def gone(self, name: str) -> None:
        """Replica `name` does not answer: nothing is served from its cache any more."""
        self.prefixes.forget(name, rank=None)

    @property
    def any_subscribed(self) -> bool:
        with self._lock:
            return any(one.subscriber is not None for one in self._replicas.values())

    def status(self) -> tuple[ReplicaKvStatus, ...]:
        with self._lock:
            ones = tuple(self._replicas.values())
        out = []
        for one in ones:
            sub = one.subscriber
            if sub is None:
                out.append(ReplicaKvStatus(one.replica.name, False, 0, 0, 0, 0, one.note))
                continue
            note = sub.problem or (
                "" if sub.receiving else "listening; none yet (a prompt must fill a block)"
            )
            out.append(
                ReplicaKvStatus(
                    name=one.replica.name,
                    receiving=sub.receiving,
                    batches=sub.index.batches,
                    missed=sub.missed,
                    bad=sub.bad + sub.bad_events,
                    dropped=sub.dropped,
                    note=note,
                )
            )
        return tuple(out)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            subscribers = [o.subscriber for o in self._replicas.values() if o.subscriber]
            for one in self._replicas.values():
                one.subscriber = None
        for subscriber in subscribers:
            subscriber.stop()
