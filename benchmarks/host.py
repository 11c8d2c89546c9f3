"""How busy this (shared) host was while a benchmark round ran.

Every benchmark prints this beside its numbers: on a shared 2-core machine a ratio measured
while something else ran is worth less than one measured on a quiet host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies over all CPUs, from /proc/stat; zeros off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields)
    return total - idle, total


@dataclass
class HostLoad:
    """Start it before a round and read it after: the host's CPU use in between."""

    busy0: float = 0.0
    total0: float = 0.0

    def start(self) -> HostLoad:
        self.busy0, self.total0 = _cpu_times()
        return self

    def busy_fraction(self) -> float:
        busy, total = _cpu_times()
        span = total - self.total0
        return (busy - self.busy0) / span if span > 0 else 0.0

    def note(self) -> str:
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return f"host {self.busy_fraction():4.0%} busy, load {load1:.2f} on {os.cpu_count()} cores"
