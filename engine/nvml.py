"""NVIDIA GPUs seen through NVML (nvidia-ml-py), never through CUDA.

kvscope's own process must not initialise CUDA before vLLM starts: vLLM forks its
tensor-parallel workers unless CUDA is already initialised, and a forked child cannot use
CUDA then. `torch.cuda.is_available()` runs `cuInit`; NVML reads the driver without it.
"""

from __future__ import annotations

import contextlib
import threading
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
