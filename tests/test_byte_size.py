"""The one bytes formatter: each unit's boundary, and the fixed-unit forms the engine's
sentences use (the start-up errors, the tape's cap notice, the memory bar)."""

from __future__ import annotations

import itertools

import pytest

from engine.byte_size import LADDER, UNIT_BYTES, Unit, figure, in_largest_unit, in_unit
from tui import format as fmt

KIB = 1024
MIB = KIB * 1024
GIB = MIB * 1024
TIB = GIB * 1024


@pytest.mark.parametrize(
    ("num_bytes", "words"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        # A fraction of a byte rounds to whole bytes, even up to 1024 itself.
        (1023.6, "1024 B"),
        (KIB, "1.0 KiB"),
        (KIB + 1, "1.0 KiB"),
        (1536, "1.5 KiB"),
        # One byte short of a MiB stays in KiB and rounds up to 1024.0 there.
        (MIB - 1, "1024.0 KiB"),
        (MIB, "1.0 MiB"),
        (GIB - 1, "1024.0 MiB"),
        (GIB, "1.0 GiB"),
        (3 * GIB // 2, "1.5 GiB"),
        (TIB - 1, "1024.0 GiB"),
        (TIB, "1.0 TiB"),
        # TiB is the largest unit: beyond it the figure grows, ungrouped.
        (1024 * TIB, "1024.0 TiB"),
        (5000 * TIB, "5000.0 TiB"),
    ],
)
def test_a_count_reads_in_the_largest_unit_it_reaches(num_bytes: float, words: str) -> None:
    assert in_largest_unit(num_bytes) == words
    # The panels' formatter is this one, so a panel and an engine sentence agree.
    assert fmt.size(num_bytes) == words


def test_each_unit_is_1024_of_the_one_below() -> None:
    sizes = [UNIT_BYTES[unit] for unit in LADDER]
    assert sizes[0] == 1
    assert all(b == a * 1024 for a, b in itertools.pairwise(sizes))


def test_the_one_decimal_unit_is_off_the_ladder() -> None:
    # The roofline's weights, in the GB its bandwidths' GB/s divide.
    assert UNIT_BYTES["GB"] == 10**9
    assert "GB" not in LADDER


@pytest.mark.parametrize(
    ("num_bytes", "unit", "places", "words"),
    [
        (3 * GIB // 2, "GiB", 2, "1.50 GiB"),
        (GIB // 100, "GiB", 2, "0.01 GiB"),
        (64 * MIB, "MiB", 1, "64.0 MiB"),
        (GIB - 1, "MiB", 1, "1024.0 MiB"),
        (512, "B", 0, "512 B"),
        (15_231_233_024, "GB", 2, "15.23 GB"),
    ],
)
def test_a_fixed_unit_keeps_its_places(num_bytes: int, unit: Unit, places: int, words: str) -> None:
    assert in_unit(num_bytes, unit, places) == words


def test_a_figure_alone_can_group_its_thousands() -> None:
    assert figure(2048 * GIB, "GiB", 1) == "2048.0"
    assert figure(2048 * GIB, "GiB", 1, grouped=True) == "2,048.0"
    assert figure(int(2.4 * GIB), "GiB", 2, grouped=True) == "2.40"


@pytest.mark.parametrize(
    ("num_bytes", "unit", "places", "words"),
    [
        # The doctor's and nvml's GiB to one place, grouped: a 2 TiB host reads "2,048.0".
        (2048 * GIB, "GiB", 1, "2,048.0 GiB"),
        (int(10.04 * GIB), "GiB", 1, "10.0 GiB"),
        # The model's disk sentence and the doctor's fixed pool: whole MiB, grouped.
        (273 * MIB, "MiB", 0, "273 MiB"),
        (2048 * MIB, "MiB", 0, "2,048 MiB"),
    ],
)
def test_a_grouped_figure_keeps_its_unit(
    num_bytes: int, unit: Unit, places: int, words: str
) -> None:
    assert in_unit(num_bytes, unit, places, grouped=True) == words
    assert words == f"{num_bytes / UNIT_BYTES[unit]:,.{places}f} {unit}"
