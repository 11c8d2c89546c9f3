"""Waiting on a condition outside a pilot: poll it, with a timeout, on the real clock.

For threads and processes the test does not drive (a scrape loop, a KV-event subscriber,
a server). A pilot test waits with tui_helpers.wait_until instead, which lets the app run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

EVERY_S = 0.05
"""How often a condition is looked at."""


def wait_for(done: Callable[[], object], timeout_s: float, *, every_s: float = EVERY_S) -> bool:
    """Whether `done()` came true within `timeout_s` (looked at once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(every_s)
    return bool(done())


def until(
    what: str, done: Callable[[], object], timeout_s: float, *, every_s: float = EVERY_S
) -> None:
    """Wait until `done()` is true; fail the test, naming `what`, after `timeout_s`."""
    if not wait_for(done, timeout_s, every_s=every_s):
        raise AssertionError(f"timed out waiting for {what}")
