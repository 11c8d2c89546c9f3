"""NVIDIA GPUs seen through NVML (nvidia-ml-py), never through CUDA.

kvscope's own process must not initialise CUDA before vLLM starts: vLLM forks its
tensor-parallel workers unless CUDA is already initialised, and a forked child cannot use
CUDA then. `torch.cuda.is_available()` runs `cuInit`; NVML reads the driver without it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_lock = threading.Lock()


def _nvml() -> Any | None:
    """The initialised `pynvml` module, or None without the package or the driver."""
    try:
        import pynvml
    except ImportError:
        return None
    with _lock:
        try:
            pynvml.nvmlInit()
        except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no GPU here
            return None
    return pynvml


def nvidia_gpu_count() -> int:
    """How many NVIDIA GPUs the driver shows; 0 without NVML or a driver."""
    nvml = _nvml()
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML lists it."""

    gpu: int
    pid: int
    name: str
    used_bytes: int | None  # None where the driver does not tell (some containers)

    def words(self) -> str:
        used = f", {self.used_bytes / 1024**3:,.1f} GiB" if self.used_bytes else ""
        return f"pid {self.pid} {self.name} (GPU {self.gpu}{used})"


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "?"  # another user's process, or another PID namespace


def gpu_processes() -> list[GpuProcess]:
    """Every process holding GPU memory (compute and graphics); [] without NVML."""
    nvml = _nvml()
    if nvml is None:
        return []
    found: dict[tuple[int, int], GpuProcess] = {}
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for lister in (
                nvml.nvmlDeviceGetComputeRunningProcesses,
                nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for p in lister(handle):
                    used = getattr(p, "usedGpuMemory", None)
                    found[(index, int(p.pid))] = GpuProcess(
                        index, int(p.pid), _process_name(int(p.pid)), int(used) if used else None
                    )
    except Exception:
        pass  # a partial list is still worth saying
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return sorted(found.values(), key=lambda p: (p.gpu, -(p.used_bytes or 0)))


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML sees it: its name and memory, in NVML's own index order."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int

    def words(self) -> str:
        return (
            f"GPU {self.index} {self.name}: {self.free_bytes / 1024**3:,.1f} of "
            f"{self.total_bytes / 1024**3:,.1f} GiB free"
        )


def gpu_devices() -> list[GpuDevice]:
    """Every GPU the driver shows, with its total and free memory; [] without NVML."""
    nvml = _nvml()
    if nvml is None:
        return []
    found: list[GpuDevice] = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            # nvidia-ml-py gives str; releases before 11.5 gave bytes.
            name = name.decode() if isinstance(name, bytes) else str(name)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(GpuDevice(index, name, int(memory.total), int(memory.free)))
    except Exception:
        pass  # a partial list is still worth saying
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return found


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment: memory (kvscope's processes, everyone else's), load, power."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    ours_bytes: int | None  # held by kvscope's processes; None where NVML lists none
    others_bytes: int | None
    util_pct: int | None
    power_w: float | None
    sm_clock_mhz: int | None

    def words(self) -> str:
        gib = 1024**3
        mem = f"{self.used_bytes / gib:,.1f} of {self.total_bytes / gib:,.1f} GiB"
        split = ""
        if self.ours_bytes is not None:
            split = f" (kvscope {self.ours_bytes / gib:,.1f}"
            split += f", others {(self.others_bytes or 0) / gib:,.1f})"
        parts = [f"GPU {self.index} {self.name}: {mem}{split}"]
        if self.util_pct is not None:
            parts.append(f"util {self.util_pct} %")
        if self.power_w is not None:
            parts.append(f"{self.power_w:,.0f} W")
        if self.sm_clock_mhz is not None:
            parts.append(f"SM {self.sm_clock_mhz:,} MHz")
        return " · ".join(parts)


def _maybe(read: Any) -> Any:
    # A field a GPU or driver does not support (NVMLError_NotSupported) is left out.
    try:
        return read()
    except Exception:
        return None


def gpu_readings(own_pids: set[int]) -> list[GpuReading] | str:
    """Every GPU now, with the memory `own_pids` hold on it; or, without NVML, why not
    (one line for the screen)."""
    nvml = _nvml()
    if nvml is None:
        return "no GPU telemetry: NVML found no NVIDIA driver here"
    found: list[GpuReading] = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            memory = nvml.nvmlDeviceGetMemoryInfo(h)
            procs = _maybe(lambda h=h: nvml.nvmlDeviceGetComputeRunningProcesses(h)) or []
            held = [(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in procs]
            known = [(pid, int(b)) for pid, b in held if b]
            ours = sum(b for pid, b in known if pid in own_pids) if known else None
            util = _maybe(lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h))
            power = _maybe(lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))  # milliwatts
            clock = _maybe(lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            found.append(
                GpuReading(
                    index=index,
                    name=name,
                    total_bytes=int(memory.total),
                    used_bytes=int(memory.used),
                    ours_bytes=ours,
                    others_bytes=sum(b for pid, b in known if pid not in own_pids)
                    if known
                    else None,
                    util_pct=int(util.gpu) if util is not None else None,
                    power_w=power / 1000.0 if power is not None else None,
                    sm_clock_mhz=int(clock) if clock is not None else None,
                )
            )
    except Exception as exc:
        if not found:
            return f"no GPU telemetry: NVML failed ({type(exc).__name__})"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return found


def process_tree(root: int) -> set[int]:
    """`root` and every process below it (vLLM's workers are kvscope's children), from
    /proc; just `root` where /proc cannot be read."""
    parents: dict[int, int] = {}
    try:
        entries = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return {root}
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree
