"""Keep Python's full garbage collections out of the token stream.

Measured with benchmarks/ui_lag.py: the app keeps ~150k GC-tracked objects alive (widgets,
styles, and Textual's per-line render caches), so a full (generation 2) collection stops
the event loop for 40-120 ms, and under a fast stream one ran every half second: that was
most of the p99 lag. The policy here:

- after start-up, collect once and `gc.freeze()` what is alive (the UI itself), so later
  collections never walk it;
- while a reply streams, no automatic full collections (young generations still run, and
  they are short); every `STREAM_COLLECT_S` one collection of what is not frozen, whose
  survivors are frozen in turn, so a long stream neither piles up garbage nor makes each
  of these collections longer than the last;
- when a reply ends (the user is reading, not waiting), collect what is not frozen and
  freeze the survivors: a few milliseconds;
- a full collection (thaw, collect, freeze again), which frees the garbage cycles frozen
  meanwhile, only when the chat is cleared or the frozen heap grew by a quarter since the
  last one. A full collection walks the whole heap: 200-300 ms thirty replies into a
  session, which at every reply's end was a freeze the user could feel.

Process-wide, so the app only does it when told to (`run_tui` does; tests do not, since
one test process runs many apps).
"""

from __future__ import annotations

import gc
import time

# Automatic full collections effectively off: only the young generations run by themselves.
STREAMING_THRESHOLDS = (700, 10, 1_000_000)
STREAM_COLLECT_S = 1.0
FULL_GROWTH = 0.25
"""A full collection once the frozen heap is this much bigger than after the last one."""


class GcPolicy:
    """Decides when full collections happen; call its hooks from the UI's life cycle."""

    def __init__(self) -> None:
        self._last_full = time.monotonic()
        self._saved: tuple[int, int, int] | None = None
        self._frozen_after_full = 0

    def started(self) -> None:
        """The UI is built: collect once, freeze it, and stop automatic full collections."""
        if self._saved is None:
            self._saved = gc.get_threshold()
        gc.set_threshold(*STREAMING_THRESHOLDS)
        self.idle(full=True)

    def idle(self, *, full: bool = False) -> None:
        """Nothing streams: collect what is new, and everything now and then (or when
        `full`, e.g. a whole transcript was just thrown away)."""
        if full or gc.get_freeze_count() > self._frozen_after_full * (1 + FULL_GROWTH):
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._frozen_after_full = gc.get_freeze_count()
        else:
            gc.collect()
            gc.freeze()
        self._last_full = time.monotonic()

    def streaming_tick(self) -> None:
        """Called from the redraw timer while tokens stream."""
        if time.monotonic() - self._last_full > STREAM_COLLECT_S:
            # Frozen objects stay frozen: this walks only what was made since the last
            # freeze, and freezing the survivors keeps the next one as short. Anything
            # frozen here that dies later is freed by the full collection at `idle()`.
            gc.collect()
            gc.freeze()
            self._last_full = time.monotonic()

    def stopped(self) -> None:
        """Give the process its GC settings back (the app is closing)."""
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            gc.unfreeze()
            self._saved = None
