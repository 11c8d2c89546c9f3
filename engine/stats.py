"""Latency summaries with the field names `vllm bench` uses."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile, as numpy's default; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize_ms(
    prefix: str, values_s: Sequence[float], pcts: Sequence[float] = (99,)
) -> dict[str, float]:
    """{mean_<prefix>_ms, median_<prefix>_ms, p99_<prefix>_ms, ...} from seconds."""
    out = {
        f"mean_{prefix}_ms": mean(values_s) * 1000.0,
        f"median_{prefix}_ms": percentile(values_s, 50) * 1000.0,
    }
    for p in pcts:
        out[f"p{p:g}_{prefix}_ms"] = percentile(values_s, p) * 1000.0
    return out
