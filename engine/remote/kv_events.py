"""A vLLM server's KV-cache events: a ZMQ subscriber, untyped msgpack, replay on a gap.

Wire format (vLLM 0.32, `vllm/distributed/kv_events.py`): each message is three frames,
(topic, 8-byte big-endian sequence number, msgpack payload). The payload is an
`EventBatch` packed as an array, `[timestamp, [event, ...], data_parallel_rank]`, and each
event is a map tagged by `"type"`: BlockStored, BlockRemoved or AllBlocksCleared. It is
decoded untyped with msgspec, so no vLLM is needed on the client.

Replay: a DEALER sends `[b"", start_seq]` to the server's ROUTER, which answers
`[b"", topic, seq, payload]` for every buffered batch from start_seq on, then
`[b"", b"", -1, b""]`.

What this can rebuild is the prefix-cache *index*: which block hashes the server holds,
their parents, and which session stored them. It cannot rebuild the physical block map:
no event carries a block ID, a request ID, or a free/in-use state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from engine.events import CachedBlock, PrefixCacheView

log = logging.getLogger("kvscope")

KV_EVENTS_FLAGS = (
    "--enable-prefix-caching --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
    '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\''
)
NO_EVENTS = (
    "The server publishes no KV events, so the block map shows occupancy only. To see "
    f"cached blocks, start the server with {KV_EVENTS_FLAGS}."
)
END_SEQ = -1

BlockHash = int | bytes


# -- decoding -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KvEvent:
    kind: str  # "BlockStored", "BlockRemoved", "AllBlocksCleared", or a newer kind
    block_hashes: tuple[BlockHash, ...] = ()
    parent_hash: BlockHash | None = None
    num_tokens: int = 0
    block_size: int = 0
    session_id: str | None = None


@dataclass(frozen=True)
class KvBatch:
    ts: float
    events: tuple[KvEvent, ...]
    rank: int | None


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if isinstance(value, list | tuple):
        return tuple(h for h in value if isinstance(h, int | bytes))
    return ()


def _hash(value: Any) -> BlockHash | None:
    return value if isinstance(value, int | bytes) else None


def _event(raw: Any) -> KvEvent:
    if isinstance(raw, dict):
        tokens = raw.get("token_ids")
        session = raw.get("session_id")
        return KvEvent(
            kind=str(raw.get("type", "?")),
            block_hashes=_hashes(raw.get("block_hashes")),
            parent_hash=_hash(raw.get("parent_block_hash")),
            num_tokens=len(tokens) if isinstance(tokens, list) else 0,
            block_size=int(raw.get("block_size") or 0),
            session_id=session if isinstance(session, str) else None,
        )
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        # Array-like tagged events (other vLLM versions): [tag, block_hashes, ...].
        kind = raw[0]
        if kind == "BlockStored" and len(raw) >= 5:
            tokens = raw[3]
            return KvEvent(
                kind=kind,
                block_hashes=_hashes(raw[1]),
                parent_hash=_hash(raw[2]),
                num_tokens=len(tokens) if isinstance(tokens, list) else 0,
                block_size=int(raw[4] or 0),
            )
        if kind == "BlockRemoved" and len(raw) >= 2:
            return KvEvent(kind=kind, block_hashes=_hashes(raw[1]))
        return KvEvent(kind=kind)
    return KvEvent(kind="?")


def decode_batch(payload: bytes) -> KvBatch:
    """One message's payload; raises ValueError if it is not an event batch."""
    try:
        obj = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from exc
    if isinstance(obj, dict):
        ts, events, rank = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    elif isinstance(obj, list) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise ValueError("not an event batch")
    if not isinstance(events, list):
        raise ValueError("event batch without an event list")
    return KvBatch(
        ts=float(ts) if isinstance(ts, int | float) else 0.0,
        events=tuple(_event(e) for e in events),
        rank=rank if isinstance(rank, int) else None,
    )


# -- the index ------------------------------------------------------------------------------------
class _Entry:
    __slots__ = ("block_hash", "num_tokens", "parent", "rank", "session_id", "stored_at", "touched")

    def __init__(
        self,
        block_hash: BlockHash,
        parent: BlockHash | None,
        num_tokens: int,
        session_id: str | None,
        rank: int,
        stored_at: float,
    ) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.num_tokens = num_tokens
        self.session_id = session_id
        self.touched: list[str] = [session_id] if session_id else []
        self.rank = rank
        self.stored_at = stored_at


class PrefixCacheIndex:
    """The set of hash-addressed blocks a server holds, rebuilt from its events.

    Thread-safe: the subscriber thread applies batches, any thread may take a view.
    """

    def __init__(self, max_blocks: int = 1_000_000) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[tuple[int, BlockHash], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.stored_total = 0
        self.reused_total = 0
        self.removed_total = 0
        self.cleared = 0
        self.batches = 0

    def apply(self, batch: KvBatch, rank: int, now: float) -> None:
        with self._lock:
            self.batches += 1
            for ev in batch.events:
                if ev.kind == "BlockStored":
                    self._stored(ev, rank, now)
                elif ev.kind == "BlockRemoved":
                    for h in ev.block_hashes:
                        self._blocks.pop((rank, h), None)
                        self.removed_total += 1
                elif ev.kind == "AllBlocksCleared":
                    self._clear(rank)
                    self.cleared += 1

    def _stored(self, ev: KvEvent, rank: int, now: float) -> None:
        n = len(ev.block_hashes)
        size = ev.block_size or (ev.num_tokens // n if n else 0)
        for i, h in enumerate(ev.block_hashes):
            key = (rank, h)
            entry = self._blocks.get(key)
            if entry is not None:
                # Stored again: a later request re-used it (kv_cache_report_mode "full").
                self.reused_total += 1
                if ev.session_id and (not entry.touched or entry.touched[-1] != ev.session_id):
                    entry.touched.append(ev.session_id)
                continue
            tokens = max(0, min(size, ev.num_tokens - i * size)) if size else 0
            parent = ev.parent_hash if i == 0 else ev.block_hashes[i - 1]
            self._blocks[key] = _Entry(h, parent, tokens, ev.session_id, rank, now)
            self.stored_total += 1
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def _clear(self, rank: int) -> None:
        for key in [k for k in self._blocks if k[0] == rank]:
            del self._blocks[key]

    def clear_rank(self, rank: int) -> None:
        with self._lock:
            self._clear(rank)

    def __len__(self) -> int:
        return len(self._blocks)

    def view(self, *, replayed: int, missed: int, receiving: bool, note: str) -> PrefixCacheView:
        with self._lock:
            blocks = tuple(
                CachedBlock(
                    block_hash=e.block_hash,
                    parent_hash=e.parent,
                    num_tokens=e.num_tokens,
                    session_id=e.session_id,
                    touched_by=tuple(e.touched),
                    rank=e.rank,
                    stored_at=e.stored_at,
                )
                for e in self._blocks.values()
            )
            return PrefixCacheView(
                blocks=blocks,
                stored_total=self.stored_total,
                reused_total=self.reused_total,
                removed_total=self.removed_total,
                cleared=self.cleared,
                batches=self.batches,
                replayed=replayed,
                missed=missed,
                receiving=receiving,
                note=note,
            )


# -- where the events come from -------------------------------------------------------------
@dataclass(frozen=True)
class EventSource:
    """One publisher (a data-parallel rank) and how this client reaches it."""

    rank: int
    endpoint: str  # what the SUB socket binds or connects to
    bind: bool  # True: the server's PUB connects to us, so we bind there
    replay: str | None  # the server's ROUTER, for a DEALER to connect to


_WILDCARDS = ("*", "0.0.0.0", "::", "[::]", "")


def _tcp_parts(endpoint: str) -> tuple[str, str] | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host, port


def _host_for_tcp(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _reachable(endpoint: str, server_host: str) -> str:
    """A server-side endpoint as this client reaches it (wildcards become the server)."""
    parts = _tcp_parts(endpoint)
    if parts is None:
        return endpoint
    host, port = parts
    if host in _WILDCARDS:
        return f"tcp://{_host_for_tcp(server_host)}:{port}"
    return endpoint


def plan_sources(config: Mapping[str, Any], server_host: str) -> tuple[list[EventSource], str]:
    """From `GET /kv_event_sources` (rank -> KVEventsConfig): what to open, or why not.

    vLLM's PUB binds when its endpoint has a wildcard (`tcp://*:5557`), ipc:// or inproc://,
    and CONNECTS to any concrete tcp address: then the subscriber must bind that address,
    which works only on the machine it names.
    """
    sources: list[EventSource] = []
    problems: list[str] = []
    for key, cfg in sorted(config.items(), key=lambda kv: str(kv[0])):
        if not isinstance(cfg, Mapping):
            continue
        try:
            rank = int(key)
        except (TypeError, ValueError):
            rank = 0
        if not cfg.get("enable_kv_cache_events") or cfg.get("publisher") not in (None, "zmq"):
            continue
        endpoint = str(cfg.get("endpoint") or "")
        replay = cfg.get("replay_endpoint")
        replay_at = _reachable(str(replay), server_host) if replay else None
        parts = _tcp_parts(endpoint)
        if endpoint.startswith("ipc://"):
            sources.append(EventSource(rank, endpoint, False, replay_at))
        elif parts is None:
            problems.append(
                f"rank {rank} publishes to {endpoint or 'nowhere'}, which no other process "
                "can reach"
            )
        elif parts[0] in _WILDCARDS:
            sources.append(EventSource(rank, _reachable(endpoint, server_host), False, replay_at))
        else:
            sources.append(EventSource(rank, endpoint, True, replay_at))
    if sources:
        return sources, ""
    if problems:
        return [], "KV events cannot reach this client: " + "; ".join(problems) + "."
    return [], NO_EVENTS


# -- the subscriber -----------------------------------------------------------------------------
RawSink = Callable[[bytes, int, bytes], None]


class KvEventSubscriber:
    """Reads KV events on its own thread into a PrefixCacheIndex, replaying any gap."""

    def __init__(
        self,
        sources: list[EventSource],
        index: PrefixCacheIndex,
        *,
        replay_timeout_s: float = 3.0,
        on_raw: RawSink | None = None,
        on_batch: Callable[[KvBatch, int], None] | None = None,
    ) -> None:
        self.sources = sources
        self.index = index
        self.replay_timeout_s = replay_timeout_s
        self.on_raw = on_raw
        self.on_batch = on_batch
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sub: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reset = threading.Event()
        self._last: dict[int, int] = {}
        self.replayed = 0
        self.missed = 0
        self.restarts = 0
        self.bad = 0
        self.problem = ""

    @property
    def receiving(self) -> bool:
        return self.index.batches > 0

    def start(self) -> str:
        """Open the sockets (errors come back as a sentence), then read on a thread."""
        self._ctx = zmq.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            for src in self.sources:
                if src.bind:
                    sub.bind(src.endpoint)
                else:
                    sub.connect(src.endpoint)
        except zmq.ZMQError as exc:
            sub.close(linger=0)
            self._ctx.term()
            self._ctx = None
            where = ", ".join(s.endpoint for s in self.sources)
            self.problem = (
                f"Could not listen for KV events at {where} ({exc.strerror}). The server's "
                "PUB socket connects to a concrete address, so this client must run on that "
                "machine and be the only one listening; or start the server with a wildcard "
                "endpoint such as tcp://*:5557."
            )
            return self.problem
        self._sub = sub
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvscope-kv-events", daemon=True)
        self._thread.start()
        return ""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def reset(self) -> None:
        """The server started again: forget sequence numbers and the old index."""
        self._reset.set()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        sub = self._sub
        assert sub is not None
        for src in self.sources:
            self._replay(src, 0)  # what the server cached before we attached
        while not self._stop.is_set():
            if self._reset.is_set():
                self._reset.clear()
                self._forget_all()
                for src in self.sources:
                    self._replay(src, 0)  # rebuild from whatever the server still holds
            try:
                if not sub.poll(200):
                    continue
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            if len(frames) != 3:
                self.bad += 1
                continue
            topic, seq_bytes, payload = frames
            self._on_message(topic, int.from_bytes(seq_bytes, "big"), payload, replayed=False)

    def _forget_all(self) -> None:
        for rank in list(self._last):
            self.index.clear_rank(rank)
        self._last.clear()
        self.restarts += 1

    def _source(self, rank: int) -> EventSource | None:
        for src in self.sources:
            if src.rank == rank:
                return src
        return self.sources[0] if len(self.sources) == 1 else None

    def _on_message(self, topic: bytes, seq: int, payload: bytes, *, replayed: bool) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError:
            self.bad += 1
            return
        if self.on_raw is not None:
            with contextlib.suppress(Exception):
                self.on_raw(topic, seq, payload)
        rank = (
            batch.rank if batch.rank is not None else (self.sources[0].rank if self.sources else 0)
        )
        last = self._last.get(rank)
        if replayed:
            if last is not None and seq <= last:
                return
            self.replayed += 1
        else:
            if last is not None and seq <= last:
                # Numbers went back: the publisher (the server) started again, empty.
                self.index.clear_rank(rank)
                self._last.pop(rank, None)
                self.restarts += 1
                last = None
            src = self._source(rank)
            if last is None and seq > 0 and src is not None:
                self._replay(src, 0)  # earlier batches, still in the server's buffer
                last = self._last.get(rank)
            elif last is not None and seq > last + 1 and src is not None:
                self._replay(src, last + 1)
                last = self._last.get(rank)
            if last is not None and seq <= last:
                return
            if last is not None and seq > last + 1:
                self.missed += seq - last - 1
        self.index.apply(batch, rank, time.perf_counter())
        self._last[rank] = seq
        if self.on_batch is not None:
            with contextlib.suppress(Exception):
                self.on_batch(batch, rank)

    def _replay(self, src: EventSource, start: int) -> None:
        if src.replay is None or self._ctx is None:
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(src.replay)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or not dealer.poll(int(left * 1000)):
                    log.info("kvscope: KV-event replay from %s timed out", src.replay)
                    return
                frames = dealer.recv_multipart()
                if len(frames) != 4:
                    continue
                _, topic, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return
                self._on_message(topic, seq, payload, replayed=True)
        except zmq.ZMQError as exc:
            log.info("kvscope: KV-event replay from %s failed: %s", src.replay, exc)
        finally:
            dealer.close(linger=0)
