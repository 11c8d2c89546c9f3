"""A clock the test holds: it reads `now`, which moves only when the test moves it."""

from __future__ import annotations


class HeldClock:
    """A `() -> float` clock (time.monotonic's shape) standing at `now`.

    For code that takes such a clock (a widget's stale check, the fleet tracker, a
    patched time.monotonic): `clock.now += 12` is twelve seconds later, exactly.
    """

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
