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
- when a reply ends or the chat is cleared (the user is reading, not waiting), thaw,
  collect fully and freeze again: garbage cycles made meanwhile are freed then.

Process-wide, so the app only does it when told to (`run_tui` does; tests do not, since
one test process runs many apps).
"""

from __future__ import annotations

import gc
import time

# Automatic full collections effectively off: only the young generations run by themselves.
STREAMING_THRESHOLDS = (700, 10, 1_000_000)
STREAM_COLLECT_S = 1.0


class GcPolicy:
    """Decides when full collections happen; call its hooks from the UI's life cycle."""

    def __init__(self) -> None:
        self._last_full = time.monotonic()
        self._saved: tuple[int, int, int] | None = None

    def started(self) -> None:
        """The UI is built: collect once, freeze it, and stop automatic full collections."""
        if self._saved is None:
            self._saved = gc.get_threshold()
        gc.set_threshold(*STREAMING_THRESHOLDS)
        self.idle()

    def idle(self) -> None:
        """Nothing streams: a good moment for a full collection (one short pause)."""
        gc.unfreeze()
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
