"""Number formatting shared by the panels, so every number reads the same everywhere."""

from __future__ import annotations


def tokens(n: int) -> str:
    """1,536 (thousands separated, as the errors print them)."""
    return f"{n:,}"


def ms(seconds: float | None) -> str:
    """A duration in milliseconds, with the precision a reader can use."""
    if seconds is None:
        return "–"
    value = seconds * 1000.0
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def ms_value(value_ms: float) -> str:
    """A number already in milliseconds, without the unit."""
    if value_ms >= 100:
        return f"{value_ms:,.0f}"
    if value_ms >= 10:
        return f"{value_ms:.1f}"
    return f"{value_ms:.2f}"


def size(num_bytes: float) -> str:
    """Bytes in binary units: 23.0 KiB, 1.50 GiB."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop always returns
