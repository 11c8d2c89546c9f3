"""A count of bytes in words: the one place a byte count becomes a figure and a unit.

Callers keep the unit and the places their readers already see (the start-up errors give
GiB to two places, the memory bar one unit for the whole bar, the model card whatever unit
the count reaches), but the division and the rounding are done here, so "1.50 GiB" means
the same bytes in every sentence. engine/ and tui/ both use it, so it lives in engine/
(which imports no UI). The units are binary but for one: the roofline gives weights in
decimal GB, since it divides them by a data sheet's GB/s.
"""

from __future__ import annotations

from typing import Literal

from engine.sizes import GIB, MIB

Unit = Literal["B", "KiB", "MiB", "GiB", "TiB", "GB"]

UNIT_BYTES: dict[Unit, int] = {
    "B": 1,
    "KiB": 1024,
    "MiB": MIB,
    "GiB": GIB,
    "TiB": 1024 * GIB,
    "GB": 1000**3,
}

# The binary units, smallest first: `in_largest_unit` takes the first one the count stays
# under 1024 of. GB is not on it: a count is never put in GB unless a caller asks.
LADDER: tuple[Unit, ...] = ("B", "KiB", "MiB", "GiB", "TiB")


def figure(num_bytes: float, unit: Unit, places: int, *, grouped: bool = False) -> str:
    """The number alone, in `unit` to `places` decimals: `figure(1536 * MIB, "GiB", 2)` is
    "1.50". For a line that names the unit once after several figures (the memory bar);
    `grouped` separates the thousands ("1,024.0") where a figure can reach them."""
    return format(num_bytes / UNIT_BYTES[unit], f"{',' if grouped else ''}.{places}f")


def in_unit(num_bytes: float, unit: Unit, places: int, *, grouped: bool = False) -> str:
    """The figure and its unit: `in_unit(1536 * MIB, "GiB", 2)` is "1.50 GiB"."""
    return f"{figure(num_bytes, unit, places, grouped=grouped)} {unit}"


def in_largest_unit(num_bytes: float) -> str:
    """In the largest binary unit the count reaches, to one place: "23.0 KiB", "1.5 GiB";
    whole bytes below a KiB ("512 B"), since a fraction of a byte is never real."""
    for unit in LADDER[:-1]:
        if num_bytes / UNIT_BYTES[unit] < 1024:
            return in_unit(num_bytes, unit, 0 if unit == "B" else 1)
    # Nothing is larger than TiB here: a bigger count reads as thousands of TiB.
    return in_unit(num_bytes, LADDER[-1], 1)
