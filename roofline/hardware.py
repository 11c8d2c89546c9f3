"""The roofline's inputs: a machine's peak numbers (`HardwareProfile`), and where they and
the models' geometries come from: shipped data files, local configs, and a short
measurement of this machine's CPU.

GPU profiles and model geometries ship as JSON in `roofline/data/` (see the `_about` field
of each file for what the numbers are). The "cpu" profile cannot ship: it is measured by
`calibrate_cpu` and cached, because a CPU's usable bandwidth and matmul speed depend on
the machine far more than any spec sheet says.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption
from engine.paths import cache_dir
from roofline.geometry import ModelGeometry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

CPU_KEY = "cpu"
CALIBRATION_FILE = "calibration.json"
# Bump when the meaning of a cached field changes, so old caches are measured again.
CALIBRATION_SCHEMA = 1


# --------------------------------------------------------------------------- profiles


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


# --------------------------------------------------------------------------- data files


def _read_data(filename: str) -> dict[str, Any]:
    # importlib.resources finds the file inside an installed wheel as well as a checkout.
    text = resources.files("roofline.data").joinpath(filename).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _norm(name: str) -> str:
    return name.strip().lower()


def _gpu_entries() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = _read_data("hardware.json")["profiles"]
    return entries


def _model_entries() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = _read_data("models.json")["models"]
    return entries


def known_gpus() -> list[str]:
    """Keys `load_profile` accepts, "cpu" last."""
    return [*_gpu_entries(), CPU_KEY]


def known_models() -> list[str]:
    """Keys of the shipped geometries."""
    return list(_model_entries())


def _resolve(name: str, entries: Mapping[str, Mapping[str, Any]], id_field: str) -> str | None:
    """The entry key matching `name` by key, alias or Hugging Face id, ignoring case."""
    wanted = _norm(name)
    for key, entry in entries.items():
        names = [key, *entry.get("aliases", [])]
        if id_field and entry.get(id_field):
            names.append(entry[id_field])
        if wanted in (_norm(n) for n in names):
            return key
    return None


# --------------------------------------------------------------------------- models


def shipped_geometry(key: str) -> ModelGeometry:
    entry = _model_entries()[key]
    return ModelGeometry.from_hf_config(entry["config"], name=entry.get("hf_id", key))


def load_geometry(
    name_or_path: str | os.PathLike[str], *, option: str = "--model"
) -> ModelGeometry:
    """A model's geometry: a shipped name (or alias, or its Hugging Face id, any case), or
    a local model folder or `config.json`.

    Raises BadOption for anything else, listing the shipped names.
    """
    text = os.fspath(name_or_path)
    key = _resolve(text, _model_entries(), "hf_id")
    if key is not None:
        return shipped_geometry(key)

    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise BadOption(option, f"the folder {text!r} has no config.json")
        label = path.resolve().name
    elif path.is_file():
        config_path = path
        label = path.resolve().parent.name
    else:
        raise BadOption(
            option,
            f"unknown model {text!r}; known: {', '.join(known_models())}, "
            "or a local model folder with a config.json",
        )
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadOption(option, f"cannot read {str(config_path)!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise BadOption(option, f"{str(config_path)!r} is not a JSON object")
    try:
        return ModelGeometry.from_hf_config(cfg, name=label)
    except BadOption as exc:
        raise BadOption(option, f"{str(config_path)!r}: {exc.reason}") from None


# --------------------------------------------------------------------------- loading profiles


def load_profile(
    key: str,
    *,
    recalibrate: bool = False,
    seconds_budget: float = 3.0,
    option: str = "--gpu",
) -> HardwareProfile:
    """A hardware profile by key or alias (any case). "cpu" is this machine, measured:
    from the calibration cache if it is there and was made on this machine, otherwise
    (or with `recalibrate=True`) by `calibrate_cpu`, which refreshes the cache.
    """
    if _norm(key) == CPU_KEY:
        if not recalibrate:
            cached = load_cached_cpu_profile()
            if cached is not None:
                return cached
        return calibrate_cpu(seconds_budget)

    entries = _gpu_entries()
    found = _resolve(key, entries, "")
    if found is None:
        raise BadOption(option, f"unknown GPU {key!r}; known: {', '.join(known_gpus())}")
    entry = entries[found]
    return HardwareProfile(
        name=entry["name"],
        key=found,
        peak_bf16_flops=float(entry["peak_bf16_flops"]),
        mem_bandwidth_bytes_s=float(entry["mem_bandwidth_bytes_s"]),
        memory_bytes=int(entry["memory_bytes"]),
        notes=entry.get("notes", ""),
        source=entry.get("source", ""),
    )


# --------------------------------------------------------------------------- CPU calibration


def calibration_cache_path() -> Path:
    return cache_dir() / CALIBRATION_FILE


def total_memory_bytes() -> int:
    """Physical RAM, or 0 where sysconf cannot tell (not Linux/macOS)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _fingerprint() -> dict[str, Any]:
    # A cache copied to (or a home shared with) another machine must not be believed:
    # these change when the hardware does.
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model_name(),
        "cpu_count": os.cpu_count() or 0,
        "memory_bytes": total_memory_bytes(),
    }


def _best_time(run: Callable[[], object], seconds: float, max_reps: int = 50) -> float:
    """Best (smallest) wall time of `run` over repeats within `seconds`; at least 2 runs.

    The best, not the mean: the floor is about what the hardware can do, and every slower
    run was slowed by something else (the scheduler, another process, page faults).
    """
    best = float("inf")
    deadline = time.perf_counter() + seconds
    reps = 0
    while reps < 2 or (reps < max_reps and time.perf_counter() < deadline):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        reps += 1
    return best


def measure_memory_bandwidth(seconds: float, nbytes: int = 256 * 1024**2) -> tuple[float, str]:
    """Bytes read + written per second by one large copy, best of several.

    The buffer must dwarf the last-level cache (tens of MB on servers) or the copy
    measures cache bandwidth instead. Decode streams weights much like this copy does.
    """
    try:
        import numpy as np
    except ImportError:
        src_b = bytearray(nbytes)
        dst_b = bytearray(nbytes)

        def copy_bytes() -> None:
            dst_b[:] = src_b

        copy_bytes()  # touch every page of the destination before timing
        best = _best_time(copy_bytes, seconds)
        return 2 * nbytes / best, "bytearray copy (numpy missing)"

    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)

    def copy() -> None:
        np.copyto(dst, src)

    copy()  # first touch faults the destination's pages in; do not time that
    best = _best_time(copy, seconds)
    return 2 * src.nbytes / best, f"numpy copy of {src.nbytes // 1024**2} MiB"


def measure_matmul_flops(seconds: float, n: int = 2048) -> tuple[float, str]:
    """FLOP/s of an n x n matmul (2 n^3 FLOPs), best of several: bf16 with torch, as
    the engine computes, or float32 numpy when torch is missing."""
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        a = torch.randn(n, n, dtype=torch.bfloat16)
        b = torch.randn(n, n, dtype=torch.bfloat16)

        def mm_torch() -> None:
            torch.matmul(a, b)

        mm_torch()  # warm-up: thread pool start, kernel selection
        best = _best_time(mm_torch, seconds)
        threads = torch.get_num_threads()
        return 2 * n**3 / best, f"torch bf16 matmul {n}x{n}, {threads} threads"

    import numpy as np

    x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    y = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)

    def mm_numpy() -> None:
        np.matmul(x, y)

    mm_numpy()
    best = _best_time(mm_numpy, seconds)
    return 2 * n**3 / best, f"numpy float32 matmul {n}x{n} (torch missing: not bf16)"


def calibrate_cpu(seconds_budget: float = 3.0, *, write_cache: bool = True) -> HardwareProfile:
    """Measure this machine's CPU and cache the profile.

    About half the budget goes to each measurement (imports and warm-ups come on top).
    Budgets under a second shrink the buffers so a quick run stays quick; the numbers
    are then rougher. Other busy processes lower both numbers (on a 2-core machine one
    busy process halves the FLOP/s), so the load average is kept in the notes.
    """
    budget = max(0.0, seconds_budget)
    small = budget < 1.0
    bandwidth, bw_how = measure_memory_bandwidth(
        budget / 2, nbytes=(64 if small else 256) * 1024**2
    )
    flops, mm_how = measure_matmul_flops(budget / 2, n=512 if small else 2048)
    try:
        load = f"load average {os.getloadavg()[0]:.2f} when measured"
    except (AttributeError, OSError):  # no getloadavg on Windows
        load = "load average unknown"
    memory = total_memory_bytes()
    cores = os.cpu_count() or 0
    profile = HardwareProfile(
        name=f"This machine's CPU ({_cpu_model_name()}, {cores} cores)",
        key=CPU_KEY,
        peak_bf16_flops=flops,
        mem_bandwidth_bytes_s=bandwidth,
        memory_bytes=memory,
        notes=(
            f"measured: bandwidth by {bw_how}; FLOP/s by {mm_how}; {load}; memory is "
            "total RAM (vLLM's CPU backend budgets from one NUMA node's memory, which can "
            "be less)"
        ),
        source=f"calibrate_cpu({seconds_budget:g} s) at {datetime.now(timezone.utc).isoformat()}",
    )
    if write_cache:
        _write_cache(profile)
    return profile


def _write_cache(profile: HardwareProfile) -> None:
    path = calibration_cache_path()
    payload = {
        "schema": CALIBRATION_SCHEMA,
        "fingerprint": _fingerprint(),
        "profile": profile.to_dict(),
    }
    # A cache that cannot be written only costs a re-measurement next time; never fail
    # the caller over it. Write-then-rename so a crash never leaves half a file.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def load_cached_cpu_profile() -> HardwareProfile | None:
    """The cached calibration if it exists, parses, and was made on this machine."""
    try:
        payload = json.loads(calibration_cache_path().read_text(encoding="utf-8"))
        if payload.get("schema") != CALIBRATION_SCHEMA:
            return None
        if payload.get("fingerprint") != _fingerprint():
            return None
        return HardwareProfile.from_dict(payload["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
