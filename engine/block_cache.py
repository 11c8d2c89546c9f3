"""BlockCacheTracker: which KV blocks are cached-but-free and which were prefix hits.

An engine tells it each change to a block as the change happens (freed with or without a
cached prefix, taken fresh or from the cache, evicted), and asks for a `BlockCacheState`
once a step. A change costs set operations on the blocks it moved; a state is rebuilt only
for the pages that changed, so a step costs what it changed, never a pass over the pool.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from engine.events import PAGE_BLOCKS, BlockCacheState

if TYPE_CHECKING:
    from collections.abc import Iterable


class BlockCacheTracker:
    """The two sets of a BlockCacheState (one owner: the step thread).

    Each change takes a batch of block IDs (the blocks one vLLM call handed over) and is a
    few set operations on them at C speed; `state` rebuilds only the pages they touched.
    """

    def __init__(self, total_blocks: int) -> None:
        pages = max(1, math.ceil(total_blocks / PAGE_BLOCKS))
        self.total_blocks = total_blocks
        self._cached: set[int] = set()
        self._reused: set[int] = set()
        self._cached_pages: list[tuple[int, ...]] = [()] * pages
        self._reused_pages: list[tuple[int, ...]] = [()] * pages
        self._dirty_cached: set[int] = set()
        self._dirty_reused: set[int] = set()
        self._state: BlockCacheState | None = None

    # -- changes, as the engine makes them -------------------------------------------------
    def freed(self, kept: Iterable[int], emptied: Iterable[int] = ()) -> None:
        """No request holds these blocks any more: `kept` keep their prefix (full blocks
        with a hash, which a later request may take back), `emptied` hold none."""
        kept, emptied = set(kept), set(emptied)
        self._drop(self._reused, kept | emptied, self._dirty_reused)
        self._add(self._cached, kept, self._dirty_cached)
        self._drop(self._cached, emptied, self._dirty_cached)

    def taken(self, blocks: Iterable[int], *, reused: bool) -> None:
        """A request got these blocks: from the prefix cache (`reused`), or as fresh
        blocks (which evicts whatever prefix they held)."""
        blocks = set(blocks)
        self._drop(self._cached, blocks, self._dirty_cached)
        if reused:
            self._add(self._reused, blocks, self._dirty_reused)
        else:
            self._drop(self._reused, blocks, self._dirty_reused)

    def evicted(self, blocks: Iterable[int]) -> None:
        """These blocks lost their prefix while free (the engine dropped it from its cache)."""
        self._drop(self._cached, set(blocks), self._dirty_cached)

    def clear(self) -> None:
        """The whole cache was reset: no free block holds a prefix any more."""
        self._dirty_cached |= {b // PAGE_BLOCKS for b in self._cached}
        self._cached.clear()

    # -- the state a sample carries ------------------------------------------------------------
    def state(self) -> BlockCacheState:
        """The sets now; the same object as last time when nothing changed since."""
        if self._state is not None and not self._dirty_cached and not self._dirty_reused:
            return self._state
        for pages, members, dirty in (
            (self._cached_pages, self._cached, self._dirty_cached),
            (self._reused_pages, self._reused, self._dirty_reused),
        ):
            for i in dirty:
                first = i * PAGE_BLOCKS
                pages[i] = tuple(b for b in range(first, first + PAGE_BLOCKS) if b in members)
            dirty.clear()
        self._state = BlockCacheState(
            cached_pages=tuple(self._cached_pages),
            reused_pages=tuple(self._reused_pages),
            cached=len(self._cached),
            reused=len(self._reused),
        )
        return self._state

    # -- helpers ---------------------------------------------------------------------------
    def _add(self, members: set[int], blocks: set[int], dirty: set[int]) -> None:
        new = blocks - members
        if new:
            if min(new) < 0 or max(new) >= self.total_blocks:
                new = {b for b in new if 0 <= b < self.total_blocks}  # no block of this pool
            members |= new
            dirty |= {b // PAGE_BLOCKS for b in new}

    @staticmethod
    def _drop(members: set[int], blocks: set[int], dirty: set[int]) -> None:
        gone = members & blocks
        if gone:
            members -= gone
            dirty |= {b // PAGE_BLOCKS for b in gone}
