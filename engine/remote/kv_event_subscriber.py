"""The ZMQ subscriber: a server's KV events read on a thread of their own, replayed on a gap.

Messages are decoded by engine/remote/kv_event_wire.py and applied to a PrefixCacheIndex.
Replay: a DEALER sends `[b"", start_seq]` to the server's ROUTER, which answers
`[b"", topic, seq, payload]` for every buffered batch from start_seq on, then
`[b"", b"", -1, b""]`.

A message that is no event batch is dropped and counted, and the thread reads on. Memory
is bounded whatever a publisher sends: a frame is at most MAX_FRAME_BYTES (ZMQ drops the
peer otherwise), and at most RECEIVE_QUEUE messages wait.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from engine.remote.kv_event_wire import KvBatch, decode_batch

if TYPE_CHECKING:
    from engine.remote.kv_event_sources import EventSource
    from engine.remote.prefix_cache_index import PrefixCacheIndex

log = logging.getLogger("kvscope")

END_SEQ = -1

# A step's batch of events is some KB (a 64k-token prefill, about 250 KB); nothing a server
# sends is near 4 MiB, and 64 of them queued are a quarter GiB at the very most.
MAX_FRAME_BYTES = 4 * 1024**2
RECEIVE_QUEUE = 64
REPLAY_EVERY_S = 2.0  # a flood of gaps must not become a flood of replays

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
