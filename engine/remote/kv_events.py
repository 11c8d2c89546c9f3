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

Every field of every event is checked before it is used (`_event`): an event that fails
is dropped and counted, the rest of its batch kept, and the thread reads on. Memory is
bounded whatever a publisher sends: a frame is at most MAX_FRAME_BYTES (ZMQ drops the
peer otherwise), at most RECEIVE_QUEUE messages wait, an event names at most
MAX_HASHES_PER_EVENT blocks, and the index holds at most MAX_INDEX_BLOCKS.
"""

from __future__ import annotations

import contextlib
import logging
import math
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

# A step's batch of events is some KB (a 64k-token prefill, about 250 KB); nothing a server
# sends is near 4 MiB, and 64 of them queued are a quarter GiB at the very most.
MAX_FRAME_BYTES = 4 * 1024**2
RECEIVE_QUEUE = 64
MAX_HASHES_PER_EVENT = 1 << 16
MAX_BLOCK_SIZE = 1 << 20
MAX_HASH_BYTES = 64
MAX_INDEX_BLOCKS = 1 << 18
REPLAY_EVERY_S = 2.0  # a flood of gaps must not become a flood of replays

BlockHash = int | bytes


class BadEvent(ValueError):
    """An event whose fields are not what vLLM sends."""


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
    bad: int = 0  # events dropped for fields vLLM never sends


def _is_hash(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(1 << 63) <= value < (1 << 64)  # vLLM's are 64-bit, signed or not
    return isinstance(value, bytes) and 0 < len(value) <= MAX_HASH_BYTES


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise BadEvent("block_hashes is not a list")
    if len(value) > MAX_HASHES_PER_EVENT:
        raise BadEvent(f"{len(value):,} block hashes in one event")
    if not all(_is_hash(h) for h in value):
        raise BadEvent("a block hash that is not a 64-bit number or a short byte string")
    return tuple(value)


def _hash(value: Any) -> BlockHash | None:
    if value is None:
        return None
    if not _is_hash(value):
        raise BadEvent("parent_block_hash is not a block hash")
    return value  # type: ignore[no-any-return]


def _count(value: Any, what: str, limit: int) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise BadEvent(f"{what} is {str(value)[:20]}, not a whole number from 0 to {limit:,}")
    return value


def _num_tokens(tokens: Any, hashes: int) -> int:
    if tokens is None:
        return 0
    if not isinstance(tokens, list):
        raise BadEvent("token_ids is not a list")
    # Only the count is kept: the IDs themselves are not looked at.
    if len(tokens) > max(1, hashes) * MAX_BLOCK_SIZE:
        raise BadEvent(f"{len(tokens):,} token IDs for {hashes:,} blocks")
    return len(tokens)


def _session(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise BadEvent("session_id is not a short string")
    return value


def _event(raw: Any) -> KvEvent:
    """One event, every field checked; raises BadEvent."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if not isinstance(kind, str):
            raise BadEvent("an event with no type")
        hashes = _hashes(raw.get("block_hashes"))
        return KvEvent(
            kind=kind[:64],
            block_hashes=hashes,
            parent_hash=_hash(raw.get("parent_block_hash")),
            num_tokens=_num_tokens(raw.get("token_ids"), len(hashes)),
            block_size=_count(raw.get("block_size"), "block_size", MAX_BLOCK_SIZE),
            session_id=_session(raw.get("session_id")),
        )
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        # Array-like tagged events (other vLLM versions): [tag, block_hashes, ...].
        kind = raw[0][:64]
        if kind == "BlockStored" and len(raw) >= 5:
            hashes = _hashes(raw[1])
            return KvEvent(
                kind=kind,
                block_hashes=hashes,
                parent_hash=_hash(raw[2]),
                num_tokens=_num_tokens(raw[3], len(hashes)),
                block_size=_count(raw[4], "block_size", MAX_BLOCK_SIZE),
            )
        if kind == "BlockRemoved" and len(raw) >= 2:
            return KvEvent(kind=kind, block_hashes=_hashes(raw[1]))
        return KvEvent(kind=kind)
    raise BadEvent("an event that is neither a map nor a tagged array")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def decode_batch(payload: bytes) -> KvBatch:
    """One message's payload; raises ValueError if it is not an event batch. Events that
    fail their checks are left out, and counted in the batch's `bad`."""
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
    good: list[KvEvent] = []
    bad = 0
    for raw in events:
        try:
            good.append(_event(raw))
        except BadEvent:
            bad += 1
    ok_rank = isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 16
    return KvBatch(
        ts=float(ts) if isinstance(ts, int | float) and _finite(ts) else 0.0,
        events=tuple(good),
        rank=rank if ok_rank else None,
        bad=bad,
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

    def __init__(self, max_blocks: int = MAX_INDEX_BLOCKS) -> None:
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
        self._monitor: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reset = threading.Event()
        self._last: dict[int, int] = {}
        self.replayed = 0
        self.missed = 0
        self.restarts = 0
        self.bad = 0  # messages that were no event batch
        self.bad_events = 0  # events dropped from good batches (see `_event`)
        self.dropped = 0  # connections ZMQ closed (a frame past MAX_FRAME_BYTES), dialled again
        self.problem = ""
        self._replayed_at: dict[int, float] = {}  # rank -> when its last replay was asked

    @property
    def receiving(self) -> bool:
        return self.index.batches > 0

    def start(self) -> str:
        """Open the sockets (errors come back as a sentence), then read on a thread."""
        self._ctx = zmq.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
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
        if any(not src.bind for src in self.sources):
            # A frame past MAXMSGSIZE makes ZMQ drop the connection and never dial again;
            # the monitor tells the thread, which dials again itself.
            self._monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvscope-kv-events", daemon=True)
        self._thread.start()
        return ""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._monitor is not None:
            if self._sub is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._sub.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
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
            self._replay_safely(src)  # what the server cached before we attached
        while not self._stop.is_set():
            if self._reset.is_set():
                self._reset.clear()
                self._forget_all()
                for src in self.sources:
                    self._replay_safely(src)  # rebuild from whatever the server still holds
            try:
                if self._monitor is not None and self._monitor.poll(0):
                    self._redial()
                if not sub.poll(200):
                    continue
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            if len(frames) != 3 or len(frames[1]) != 8:
                self.bad += 1
                continue
            topic, seq_bytes, payload = frames
            try:
                self._on_message(topic, int.from_bytes(seq_bytes, "big"), payload, replayed=False)
            except Exception:  # never the end of the thread: the next message may be fine
                log.exception("kvscope: a KV-event message could not be applied")
                self.bad += 1

    def _redial(self) -> None:
        """A connection we dialled was closed: dial every such source again."""
        from zmq.utils.monitor import recv_monitor_message

        monitor, sub = self._monitor, self._sub
        assert monitor is not None and sub is not None
        while monitor.poll(0):
            recv_monitor_message(monitor)
        self.dropped += 1
        for src in self.sources:
            if not src.bind:
                with contextlib.suppress(zmq.ZMQError):
                    sub.disconnect(src.endpoint)
                sub.connect(src.endpoint)

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
        self.bad_events += batch.bad
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
            gap = (last is None and seq > 0) or (last is not None and seq > last + 1)
            if gap and src is not None and not self._may_replay(rank):
                src = None
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

    def _replay_safely(self, src: EventSource) -> None:
        try:
            self._replay(src, 0)
        except Exception:  # a replay that goes wrong must not end the thread
            log.exception("kvscope: KV-event replay failed")
            self.bad += 1

    def _may_replay(self, rank: int) -> bool:
        """At most one replay per rank every REPLAY_EVERY_S: in a flood, gaps are counted
        as missed rather than each asked for again."""
        now = time.monotonic()
        if now - self._replayed_at.get(rank, -math.inf) < REPLAY_EVERY_S:
            return False
        self._replayed_at[rank] = now
        return True

    def _replay(self, src: EventSource, start: int) -> None:
        if src.replay is None or self._ctx is None:
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
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
                if len(frames) != 4 or len(frames[2]) != 8:
                    self.bad += 1
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
