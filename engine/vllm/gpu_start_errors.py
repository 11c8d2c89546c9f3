"""What vLLM and torch say when an engine cannot start on a GPU, turned into kvscope's typed
errors, keeping their own figures. The patterns are the literal messages of the pinned vLLM
(0.32, and 0.33 read from its wheel) and of torch's CUDA allocator; tests/test_gpu_true.py
holds one sample of each."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from engine.errors import (
    CompilerMissing,
    DeviceMemoryTaken,
    DeviceOutOfMemory,
    DeviceTooOld,
    KvscopeError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.nvml import GpuProcess

# v1/worker/utils.py, request-memory check: "... is less than desired GPU memory
# utilization (0.92, 72.91 GiB)", or, with weights held elsewhere, "... is less than the
# engine's budget after excluding external process's weights (0.92, 60.00 GiB)".
_FREE_MEMORY = re.compile(
    r"Free memory on device (?P<device>\S+) \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on "
    r"startup is less than (?:desired GPU memory utilization|the engine's budget after "
    r"excluding external process's weights) \((?P<util>[\d.]+), (?P<wanted>[\d.]+) GiB\)"
)
# c10's CUDA caching allocator (torch.OutOfMemoryError).
_CUDA_OOM = re.compile(
    r"CUDA out of memory\. Tried to allocate (?P<tried>[\d.]+ [KMGT]?i?B)\."
    r"(?: GPU (?P<gpu>\d+) has a total capacity of (?P<total>[\d.]+ [KMGT]?i?B) of which "
    r"(?P<free>[\d.]+ [KMGT]?i?B) is free\.)?"
)
# v1/worker/gpu_model_runner.py, after a warm-up ran out of memory.
_WARMUP_OOM = re.compile(r"CUDA out of memory occurred when warming up (?P<what>\w+)")
# platforms/cuda.py check_if_supports_dtype.
_BF16 = re.compile(
    r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0\. "
    r"Your (?P<gpu>.+?) GPU (?:has compute capability (?P<cap>[\d.]+)|does not have a "
    r"compute capability)"
)
# triton/runtime/build.py; torch inductor's C++ build (Python.h missing).
_NO_COMPILER = "Failed to find C compiler"
_NO_HEADERS = re.compile(r"fatal error: Python\.h: No such file or directory")


def _holder_words(holders: Callable[[], Sequence[GpuProcess]]) -> tuple[str, ...]:
    return tuple(p.words() for p in holders())


def map_gpu_start_error(
    text: str, holders: Callable[[], Sequence[GpuProcess]]
) -> KvscopeError | None:
    """The typed error for a GPU start-up failure in `text`, or None if it is none of
    them. `holders` lists the processes on the GPU (NVML); it is asked only when the
    failure is about memory."""
    if m := _FREE_MEMORY.search(text):
        return DeviceMemoryTaken(
            m["device"],
            float(m["free"]),
            float(m["total"]),
            float(m["util"]),
            float(m["wanted"]),
            _holder_words(holders),
        )
    if m := _CUDA_OOM.search(text):
        device = f"GPU {m['gpu']}" if m["gpu"] else ""
        return DeviceOutOfMemory(
            m["tried"], device, m["total"] or "", m["free"] or "", _holder_words(holders)
        )
    if m := _WARMUP_OOM.search(text):
        return DeviceOutOfMemory(
            f"memory to warm up the {m['what']}", holders=_holder_words(holders)
        )
    if m := _BF16.search(text):
        return DeviceTooOld(m["gpu"], m["cap"])
    if _NO_COMPILER in text:
        return CompilerMissing("found no C compiler (Triton asked for one; CC is not set)")
    if _NO_HEADERS.search(text):
        return CompilerMissing("found no Python.h (Python's development headers)")
    return None
