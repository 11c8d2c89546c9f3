"""Keep Python's full garbage collections short while tokens stream.

Measured on the UI benchmark: with the app's widget tree, stylesheets and imports alive, a
generation-2 collection scans ~150k objects and stops the event loop for 75-90 ms, several
times a second under a fast stream, and that was the whole of the p99 lag. `gc.freeze()`
moves everything alive at that moment out of the collector's sight, so later collections
only scan what was made since. Objects freed by reference counting are still freed; only
garbage *cycles* among frozen objects would wait, so a new chat (which drops a whole
transcript) thaws, collects once, and freezes again.

Process-wide, so the app only does it when told to (`run_tui` does; tests do not, since
one test process runs many apps).
"""

from __future__ import annotations

import gc


def freeze() -> None:
    """Take everything alive now out of future collections (cheap: no scan)."""
    gc.freeze()


def collect_and_freeze() -> None:
    """Thaw, collect cycles once (one pause, on a user action), then freeze again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
