"""A bench point on the roofline: the FLOP/s and bytes/s it achieved, its intensity, and
how close it came to the roof that binds it (issue #32).

A point's work is vLLM's own count (`--enable-mfu-metrics`): in-process, the sum of its
steps' `StepSample.perf` over the sum of those steps' durations (the time the engine was
stepping, not the client's wall clock, so the rate is the steps' own); attached, the sum of
the server's counter deltas (`ScrapeSample.perf`) over the scrape windows the point ran in,
whose time includes whatever idle the windows held, so it can only read lower.

Intensity is the point's FLOPs over all its bytes (read + written), not a mean of the
steps' intensities: a mean would weigh a 1-token decode step like a 4k-token prefill.

The binding roof is the lower one at that intensity: peak compute right of the ridge, the
bandwidth slope left of it. No point can do better than it; one that appears to is a
calibration problem (the roofs are too low, or the counts wrong) and is reported as such,
never as a share over 100 %.

Pure arithmetic on the engine's events: no engine, no UI. The roofs themselves come from
the same source as the live panel's (`tui/roofline_figure.machine_roofs`, or a hardware
profile), handed in by the CLI as `PointRoofs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from engine.remote.vllm_metrics import MFU_FLAG

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.events import ScrapeSample, StepPerf, StepSample

Unit = Literal["steps", "scrape windows"]
Kind = Literal["prefill", "decode"]
Binding = Literal["compute", "bandwidth"]
KINDS: tuple[Kind, ...] = ("prefill", "decode")

ABOVE_SLACK = 1e-9
"""A share past 1 by more than float rounding is above the roof."""

NO_STEP_COUNTS = (
    "the engine counted no step's FLOPs or bytes: vLLM counts them with "
    f"{MFU_FLAG} (kvscope turns it on in-process unless --no-enable-mfu-metrics is given)"
)
NO_SERVER_COUNTS = (
    "this server counts no FLOPs or bytes (its vllm:estimated_*_per_gpu_total counters "
    f"are absent or zero): start it with `vllm serve … {MFU_FLAG}` for FLOP/s, GB/s and "
    "intensity"
)
NO_VIEW = "the engine showed neither its steps nor /metrics scrapes over this point"


@dataclass(frozen=True, slots=True)
class PointRoofs:
    """A machine's two roofs: peak FLOP/s (flat) and memory bandwidth (the slope)."""

    name: str  # whose: "this CPU (calibrated)", "NVIDIA L4", "the fake's set machine"
    peak_flops: float
    bandwidth: float  # bytes/s

    @property
    def ridge(self) -> float:
        """The intensity where the roofs meet, FLOPs per byte."""
        return self.peak_flops / self.bandwidth

    def roof(self, intensity: float) -> float:
        """The most FLOP/s work of `intensity` can achieve here."""
        return min(self.peak_flops, self.bandwidth * intensity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_flops": self.peak_flops,
            "bandwidth_bytes_s": self.bandwidth,
            "ridge_flops_per_byte": self.ridge,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "the roofs") -> PointRoofs:
        """What `to_dict` wrote; a ValueError in words for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a JSON object")
        figures = []
        for key in ("peak_flops", "bandwidth_bytes_s"):
            value = data.get(key)
            if not _positive(value):
                raise ValueError(f'{where} has "{key}": {value!r}, not a positive number')
            figures.append(float(value))
        return cls(str(data.get("name") or "saved roofs"), figures[0], figures[1])


@dataclass(frozen=True, slots=True)
class PointPerf:
    """The work a point did and the time it took, as counted by `source`."""

    flops: float
    read_bytes: float
    write_bytes: float
    seconds: float  # the counted steps' durations, or the windows' intervals, summed
    counted: int  # steps (or windows) with counts
    of: int  # steps (or windows) in the point: counted ones and the rest
    unit: Unit
    source: str  # "vllm", "vllm counters", the fake's

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PointPerf:
        """What `perf_record` wrote (its derived figures are derived again); a ValueError
        naming the first key that is missing or not a number."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a JSON object")
        numbers: dict[str, float] = {}
        for key in ("flops", "read_bytes", "write_bytes", "seconds", "counted", "of"):
            value = data.get(key)
            if not _number(value) or value < 0:
                raise ValueError(f'{where} has "{key}": {value!r}, not a number of 0 or more')
            numbers[key] = float(value)
        unit = data.get("unit")
        if unit not in ("steps", "scrape windows"):
            raise ValueError(f'{where} has "unit": {unit!r}, not "steps" or "scrape windows"')
        return cls(
            flops=numbers["flops"],
            read_bytes=numbers["read_bytes"],
            write_bytes=numbers["write_bytes"],
            seconds=numbers["seconds"],
            counted=int(numbers["counted"]),
            of=int(numbers["of"]),
            unit=unit,
            source=str(data.get("source", "")),
        )

    @property
    def moved_bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.moved_bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved; None when no byte moved."""
        return self.flops / self.moved_bytes if self.moved_bytes > 0 else None


@dataclass(frozen=True, slots=True)
class RoofShare:
    """How close a point came to the roof that binds it."""

    binding: Binding
    roof_flops_per_s: float  # the binding roof at the point's intensity
    share: float  # achieved / roof; over 1 only when `above`

    @property
    def above(self) -> bool:
        """Above its roof: the roofs or the counts are wrong, not the point fast."""
        return self.share > 1 + ABOVE_SLACK

    def words(self) -> str:
        """ "62 % of the bandwidth roof", or the calibration problem in words."""
        if self.above:
            return f"⚠ above the {self.binding} roof ({self.share:.2f}x): calibration problem"
        return f"{100 * self.share:.0f} % of the {self.binding} roof"


def roof_share(perf: PointPerf, roofs: PointRoofs) -> RoofShare | None:
    """The binding roof at the point's intensity and the point's share of it; None for a
    point with no intensity or no time (nothing to place under a roof)."""
    intensity = perf.intensity
    if intensity is None or perf.seconds <= 0:
        return None
    roof = roofs.roof(intensity)
    binding: Binding = "compute" if roofs.bandwidth * intensity >= roofs.peak_flops else "bandwidth"
    return RoofShare(binding, roof, perf.flops_per_s / roof)


def _sum(perfs: list[tuple[StepPerf, float]], of: int, unit: Unit) -> PointPerf | None:
    if not perfs:
        return None
    return PointPerf(
        flops=sum(p.flops for p, _ in perfs),
        read_bytes=sum(p.read_bytes for p, _ in perfs),
        write_bytes=sum(p.write_bytes for p, _ in perfs),
        seconds=sum(s for _, s in perfs),
        counted=len(perfs),
        of=of,
        unit=unit,
        source=perfs[-1][0].source,
    )


def step_kind(step: StepSample) -> Kind:
    """A step with any prompt tokens counts as prefill: its work is the prompt's."""
    return "prefill" if step.prefill_tokens > 0 else "decode"


def steps_perf(steps: Iterable[StepSample], kind: Kind | None = None) -> PointPerf | None:
    """The point's steps' counts and durations summed (only `kind`'s, if given); None when
    no step of them was counted."""
    ran = [s for s in steps if not s.idle and (kind is None or step_kind(s) == kind)]
    return _sum([(s.perf, s.duration_s) for s in ran if s.perf is not None], len(ran), "steps")


def windows_perf(scrapes: Iterable[ScrapeSample]) -> PointPerf | None:
    """The server's counted work over the point's scrape windows; None when none counted."""
    windows = list(scrapes)
    counted = [(s.perf, s.interval_s) for s in windows if s.perf is not None]
    return _sum(counted, len(windows), "scrape windows")


def perf_record(perf: PointPerf, roofs: PointRoofs | None) -> dict[str, Any]:
    """One point's (or one kind's) figures for `--json`: achieved FLOP/s and bytes/s, the
    intensity, and its binding roof's share, or, above the roof, the problem instead."""
    out: dict[str, Any] = {
        "source": perf.source,
        "unit": perf.unit,
        "counted": perf.counted,
        "of": perf.of,
        "flops": perf.flops,
        "read_bytes": perf.read_bytes,
        "write_bytes": perf.write_bytes,
        "seconds": perf.seconds,
        "flops_per_s": perf.flops_per_s,
        "bytes_per_s": perf.bytes_per_s,
        "intensity_flops_per_byte": perf.intensity,
    }
    share = roof_share(perf, roofs) if roofs is not None else None
    if share is not None:
        out["binding_roof"] = share.binding
        out["roof_flops_per_s"] = share.roof_flops_per_s
        # Above the roof the share is no figure of the point: the problem is said instead.
        out["share_of_roof"] = None if share.above else share.share
        out["above_roof"] = share.above
        if share.above:
            out["problem"] = share.words()
    return out


@dataclass(frozen=True, slots=True)
class PointRoofline:
    """A bench point's place on the roofline: the whole point, in-process also split into
    its prefill and decode steps, or why there are no figures."""

    whole: PointPerf | None
    by_kind: tuple[tuple[Kind, PointPerf], ...] = ()
    missing: str = ""  # why no figures ("" when there are)

    def to_dict(self, roofs: PointRoofs | None) -> dict[str, Any]:
        if self.whole is None:
            return {"missing": self.missing}
        out = perf_record(self.whole, roofs)
        if self.by_kind:
            out["by_kind"] = {k: perf_record(p, roofs) for k, p in self.by_kind}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PointRoofline:
        """What `to_dict` wrote (its shares are worked out again from the roofs)."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a JSON object")
        if "flops" not in data:
            return cls(None, missing=str(data.get("missing") or NO_VIEW))
        parts = data.get("by_kind") or {}
        if not isinstance(parts, dict):
            raise ValueError(f'{where} has "by_kind": {parts!r}, not an object')
        kinds = tuple(
            (k, PointPerf.from_dict(parts[k], f"{where}'s {k}")) for k in KINDS if k in parts
        )
        return cls(PointPerf.from_dict(data, where), kinds)


def point_roofline(
    steps: Iterable[StepSample] = (), scrapes: Iterable[ScrapeSample] = ()
) -> PointRoofline:
    """The point's roofline figures from what the engine showed over it: its steps (an
    in-process engine) or its scrapes (attached); without counts, which flag gives them."""
    ran = [s for s in steps if not s.idle]
    if ran:
        whole = steps_perf(ran)
        if whole is None:
            return PointRoofline(None, missing=NO_STEP_COUNTS)
        kinds = tuple((k, p) for k in KINDS if (p := steps_perf(ran, k)) is not None)
        return PointRoofline(whole, kinds)
    windows = list(scrapes)
    if windows:
        whole = windows_perf(windows)
        return PointRoofline(whole, missing="" if whole is not None else NO_SERVER_COUNTS)
    return PointRoofline(None, missing=NO_VIEW)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> TypeGuard[float]:
    return _number(value) and value > 0
