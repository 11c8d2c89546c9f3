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
