"""The prefix-cache index: which block hashes a server holds, rebuilt from its KV events.

Each block is known by (data-parallel rank, hash), with its parent, its token count and
the chat sessions that stored or re-used it. It is an index, not the physical block map:
the events carry no block IDs (engine/remote/kv_event_wire.py). The index holds at most
MAX_INDEX_BLOCKS, the oldest forgotten first, whatever a publisher sends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from engine.events import CachedBlock, PrefixCacheView

if TYPE_CHECKING:
    from engine.remote.kv_event_wire import BlockHash, KvBatch, KvEvent

MAX_INDEX_BLOCKS = 1 << 18


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
