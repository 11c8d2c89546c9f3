"""Where every prefix lives: the prefix-cache index across the fleet, from KV events.

Each replica keeps its own engine/remote `PrefixCacheIndex`, fed by its own
`KvEventSubscriber` (`index_for(name)` is what to hand it) or by `apply` here; nothing in
this module decodes an event. A `FleetPrefixView` then joins them: which replicas hold a
block hash, each chat session's cached blocks by replica, and blocks cached on several
replicas at once (the same prefix in two pools: memory spent twice).

One block hash means one prefix on every replica only when they hash alike: vLLM's
default sha256 does; a non-cryptographic hash (xxhash) needs one PYTHONHASHSEED on all
of them, else the same prefix has a different hash on each and no block is shared here.

A turn's placement compares where its session's prefix was cached when the turn was sent
(`before_turn`) with the replica that served it (engine/fleet/attribution.py): "prefix:
412 of 430 tokens cached on replica b", or "cache miss: prefix on a, sent to b", a miss
the router caused.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.remote.kv_event_wire import BlockHash, KvBatch, decode_batch
from engine.remote.prefix_cache_index import PrefixCacheIndex

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from engine.events import PrefixCacheView
    from engine.fleet.replicas import ReplicaSet

# The turns whose placement is kept (the fleet view counts misses past them).
MAX_PLACEMENTS = 1024


@dataclass(frozen=True)
class SessionCache:
    """One session's blocks in one replica's cache: those it stored or re-used."""

    replica: str
    blocks: int
    tokens: int


@dataclass(frozen=True)
class SharedBlock:
    """A block hash cached on more than one replica."""

    block_hash: BlockHash
    replicas: tuple[str, ...]
    num_tokens: int


@dataclass(frozen=True)
class FleetPrefixView:
    """The fleet's prefix caches at one moment, joined by block hash and by session."""

    replicas: tuple[tuple[str, PrefixCacheView], ...]
    holders: dict[BlockHash, tuple[str, ...]]
    sessions: dict[str, tuple[SessionCache, ...]]  # most cached tokens first

    def replica(self, name: str) -> PrefixCacheView | None:
        return next((v for n, v in self.replicas if n == name), None)

    def where(self, session_id: str) -> tuple[SessionCache, ...]:
        """Where this session's prefix is cached, most tokens first; () if nowhere."""
        return self.sessions.get(session_id, ())

    def shared(self) -> tuple[SharedBlock, ...]:
        """Every block cached on two or more replicas."""
        tokens: dict[BlockHash, int] = {}
        for _, view in self.replicas:
            for b in view.blocks:
                tokens[b.block_hash] = max(tokens.get(b.block_hash, 0), b.num_tokens)
        return tuple(
            SharedBlock(h, names, tokens.get(h, 0))
            for h, names in self.holders.items()
            if len(names) > 1
        )

    @property
    def duplicated_tokens(self) -> int:
        """Tokens held more than once across the fleet: each extra copy counts once."""
        return sum(b.num_tokens * (len(b.replicas) - 1) for b in self.shared())


def _join(replicas: tuple[tuple[str, PrefixCacheView], ...]) -> FleetPrefixView:
    holders: dict[BlockHash, list[str]] = {}
    per_session: dict[str, dict[str, list[int]]] = {}
    for name, view in replicas:
        for b in view.blocks:
            names = holders.setdefault(b.block_hash, [])
            if name not in names:
                names.append(name)
            for session in dict.fromkeys((b.session_id, *b.touched_by)):
                if session is None:
                    continue
                count = per_session.setdefault(session, {}).setdefault(name, [0, 0])
                count[0] += 1
                count[1] += b.num_tokens
    sessions = {
        session: tuple(
            sorted(
                (SessionCache(name, n, tokens) for name, (n, tokens) in by.items()),
                key=lambda c: (-c.tokens, c.replica),
            )
        )
        for session, by in per_session.items()
    }
    return FleetPrefixView(
        replicas=replicas,
        holders={h: tuple(names) for h, names in holders.items()},
        sessions=sessions,
    )


Placement = Literal["hit", "miss", "nothing cached", "replica unknown"]


@dataclass(frozen=True)
class TurnPlacement:
    """Where one turn went against where its session's prefix was cached when it was sent."""

    session_id: str
    served_by: str | None
    prompt_tokens: int
    cached_before: tuple[SessionCache, ...]  # the session's blocks by replica, at send time
    # The serving replica's own count of prompt tokens it found cached (the answer's
    # `cached_tokens`), when it sent one: truer than the index's blocks of the session.
    server_cached: int | None = None

    @property
    def cached_on_server(self) -> int:
        """Tokens of this prompt cached on the replica that served it, at most the prompt:
        the replica's own count when it gave one, else this session's blocks there."""
        if self.server_cached is not None:
            tokens = self.server_cached
        else:
            tokens = next((c.tokens for c in self.cached_before if c.replica == self.served_by), 0)
        return min(tokens, self.prompt_tokens) if self.prompt_tokens else tokens

    @property
    def kind(self) -> Placement:
        if self.served_by is None:
            return "replica unknown"
        if not self.cached_before:
            # The index knows nothing of the session there, but the replica found some
            # of the prompt cached (a system prompt another session stored): a hit.
            return "hit" if self.server_cached else "nothing cached"
        if any(c.replica == self.served_by for c in self.cached_before):
            return "hit"
        return "miss"

    @property
    def router_miss(self) -> bool:
        """The prefix was cached on another replica, and the turn went elsewhere."""
        return self.kind == "miss"

    def words(self) -> str:
        cached_on = _names(c.replica for c in self.cached_before)
        kind = self.kind
        if kind == "hit":
            return (
                f"prefix: {self.cached_on_server:,} of {self.prompt_tokens:,} tokens cached on "
                f"replica {self.served_by}"
            )
        if kind == "miss":
            return f"cache miss: prefix on {cached_on}, sent to {self.served_by}"
        if kind == "nothing cached":
            return (
                f"prefix: 0 of {self.prompt_tokens:,} tokens cached (nothing of this session "
                f"was cached on any replica); sent to {self.served_by}"
            )
        if self.cached_before:
            best = self.cached_before[0]
            return (
                f"prefix: {best.tokens:,} tokens cached on {cached_on}; which replica served "
                "this turn is not known"
            )
        return "prefix: nothing of this session cached; which replica served it is not known"


def _names(names: Iterable[str]) -> str:
    listed = list(dict.fromkeys(names))
    if len(listed) <= 1:
        return "".join(listed)
    return ", ".join(listed[:-1]) + " and " + listed[-1]


@dataclass(frozen=True)
class ActivityMark:
    """Blocks each replica's KV events have stored or re-reported so far: by session, and in
    all. Two marks around a request tell which replica's cache it touched."""

    by_session: dict[str, dict[str, int]]  # replica -> session -> blocks
    total: dict[str, int]  # replica -> blocks


class FleetPrefixIndex:
    """One PrefixCacheIndex per replica; `view()` joins them. Thread-safe.

    A replica's KvEventSubscriber fills `index_for(name)` and should be given
    `on_batch=fleet.batch_hook(name)`, so that per-session activity is counted too.
    """

    def __init__(self, replicas: ReplicaSet) -> None:
        self.names = replicas.names
        # engine/remote's own bound on each replica's index.
        self._indexes = {n: PrefixCacheIndex() for n in self.names}
        # The latest turns only: a long session must not grow this without end.
        self._placements: deque[TurnPlacement] = deque(maxlen=MAX_PLACEMENTS)
        self.router_miss_count = 0  # over the whole session, past the deque's reach
        self._lock = threading.Lock()
        self._by_session: dict[str, dict[str, int]] = {n: {} for n in self.names}
        self._total: dict[str, int] = dict.fromkeys(self.names, 0)

    def index_for(self, name: str) -> PrefixCacheIndex:
        """The index a KvEventSubscriber for replica `name` should fill."""
        return self._indexes[name]

    def apply(self, name: str, batch: KvBatch, rank: int = 0, now: float | None = None) -> None:
        """One event batch from replica `name` (its data-parallel `rank`)."""
        at = time.perf_counter() if now is None else now
        self._indexes[name].apply(batch, rank, at)
        self.count(name, batch)

    def batch_hook(self, name: str) -> Callable[[KvBatch, int], None]:
        """For KvEventSubscriber(on_batch=...): it fills the index, this counts activity."""
        return lambda batch, _rank: self.count(name, batch)

    def count(self, name: str, batch: KvBatch) -> None:
        """Count the blocks this batch stored or re-reported, by session."""
        with self._lock:
            sessions = self._by_session[name]
            for ev in batch.events:
                if ev.kind != "BlockStored":
                    continue
                self._total[name] += len(ev.block_hashes)
                if ev.session_id:
                    sessions[ev.session_id] = sessions.get(ev.session_id, 0) + len(ev.block_hashes)

    def mark(self) -> ActivityMark:
        with self._lock:
            return ActivityMark(
                {n: dict(s) for n, s in self._by_session.items()}, dict(self._total)
            )

    def apply_payload(self, name: str, payload: bytes, now: float | None = None) -> None:
        """One raw msgpack payload from replica `name`; raises ValueError if it is none."""
        batch = decode_batch(payload)
        self.apply(name, batch, batch.rank if batch.rank is not None else 0, now)

    def forget(self, name: str, rank: int | None = 0) -> None:
        """Replica `name` started again (or is gone): its cache is empty (on every rank
        when `rank` is None)."""
        index = self._indexes[name]
        if rank is not None:
            index.clear_rank(rank)
            return
        ranks = {b.rank for b in index.view(replayed=0, missed=0, receiving=False, note="").blocks}
        for r in ranks:
            index.clear_rank(r)

    def view(self) -> FleetPrefixView:
        return _join(
            tuple(
                (n, idx.view(replayed=0, missed=0, receiving=idx.batches > 0, note=""))
                for n, idx in self._indexes.items()
            )
        )

    def before_turn(self, session_id: str) -> tuple[SessionCache, ...]:
        """Where `session_id`'s prefix is cached now: take it before sending the turn."""
        return self.view().where(session_id)

    def placed(
        self,
        session_id: str,
        served_by: str | None,
        prompt_tokens: int,
        cached_before: tuple[SessionCache, ...],
        server_cached: int | None = None,
    ) -> TurnPlacement:
        """Record where a turn went; its words go in the reply footer."""
        placement = TurnPlacement(
            session_id, served_by, prompt_tokens, cached_before, server_cached
        )
        with self._lock:
            self._placements.append(placement)
            self.router_miss_count += placement.router_miss
        return placement

    @property
    def placements(self) -> tuple[TurnPlacement, ...]:
        with self._lock:
            return tuple(self._placements)

    @property
    def router_misses(self) -> tuple[TurnPlacement, ...]:
        return tuple(p for p in self.placements if p.router_miss)
