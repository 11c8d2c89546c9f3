"""`HardwareProfile`: a machine's peak numbers, the one value type the roofline reads.

It sits apart from where profiles come from (`roofline.hardware`, the shipped files) and
from how the "cpu" one is measured (`roofline.cpu_calibration`): both build it, and the
loader calls the calibration, so the type below them both keeps the three free of a circle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

CPU_KEY = "cpu"
"""The key of the one profile that is measured on this machine, never shipped."""


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """A machine's peak numbers, as the vendor states them (or as measured, for "cpu")."""

    name: str
    key: str
    peak_bf16_flops: float  # dense (no 2:4 sparsity), FLOP/s
    mem_bandwidth_bytes_s: float
    memory_bytes: int
    notes: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareProfile:
        return cls(
            name=str(data["name"]),
            key=str(data["key"]),
            peak_bf16_flops=float(data["peak_bf16_flops"]),
            mem_bandwidth_bytes_s=float(data["mem_bandwidth_bytes_s"]),
            memory_bytes=int(data["memory_bytes"]),
            notes=str(data.get("notes", "")),
            source=str(data.get("source", "")),
        )
