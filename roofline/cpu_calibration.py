"""Measuring this machine's CPU for the roofline: its peak FLOP/s and memory bandwidth.

A CPU's usable bandwidth and matmul speed depend on the machine far more than any spec
sheet says, so the "cpu" profile cannot ship with the GPUs' in `roofline/data/`: it is
measured by `calibrate_cpu` and cached, with a fingerprint of the machine so a cache
copied elsewhere is measured again. `roofline.hardware.load_profile("cpu")` reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from engine.paths import cache_dir
from roofline.hardware_profile import CPU_KEY, HardwareProfile

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

CALIBRATION_FILE = "calibration.json"
# Bump when the meaning of a cached field changes, so old caches are measured again.
# 2: the peak FLOP/s is the fastest of float32 and bf16 (1 timed a bf16 matmul only, which
# without bf16 units runs a slow path at a hundredth of the machine's speed).
CALIBRATION_SCHEMA = 2


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


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _fastest_rate(
    make: Callable[[int], Callable[[], object]],
    work: Callable[[int], float],
    sizes: Sequence[int],
    seconds: float,
    max_reps: int = 8,
) -> tuple[float, int]:
    """(best work per second, the size it came at) of `make(n)()` over growing sizes.

    Each size runs at most `max_reps` times, and a bigger one (8x the work for a matmul)
    is tried only while its first run fits in what is left of `seconds`: so a slow path
    (a bf16 matmul without bf16 units runs at 1 GFLOP/s) costs a fraction of a second,
    never the minutes a fixed 2,048 x 2,048 took. Even the first run counts: it can only
    understate the rate, and the rate is then the best of them.
    """
    deadline = time.perf_counter() + seconds
    best_rate, best_size = 0.0, sizes[0]
    growth = 8.0
    for i, n in enumerate(sizes):
        run = make(n)
        elapsed = _timed(run)
        rate = work(n) / max(elapsed, 1e-9)
        reps = 1
        while reps < max_reps and time.perf_counter() + elapsed < deadline:
            elapsed = _timed(run)
            rate = max(rate, work(n) / max(elapsed, 1e-9))
            reps += 1
        if rate > best_rate:
            best_rate, best_size = rate, n
        if i + 1 < len(sizes):
            growth = (work(sizes[i + 1]) / work(n)) if work(n) > 0 else growth
        if time.perf_counter() + elapsed * growth > deadline:
            break
    return best_rate, best_size


@dataclass(frozen=True, slots=True)
class Rate:
    """One way of measuring a peak, and what it gave."""

    how: str
    value: float


CHUNK_BYTES = 16 * 1024**2
"""Memory is timed a chunk at a time: a chunk takes about a millisecond, shorter than a
scheduler's time slice, so on a busy host most chunks still run uninterrupted, and the
best of them is the machine's rate, not the share another process left it."""


def _best_chunk_rate(
    chunks: int, move: Callable[[int], object], chunk_bytes: int, seconds: float
) -> float:
    """Bytes per second of the fastest `move(i)` over passes through every chunk in turn.

    Passing through the whole buffer in order means each chunk comes back to the cache
    cold (the rest of the buffer, far larger than any cache, went through in between).
    """
    best = float("inf")
    deadline = time.perf_counter() + seconds
    passes = 0
    while passes < 2 or time.perf_counter() < deadline:
        for i in range(chunks):
            start = time.perf_counter()
            move(i)
            best = min(best, time.perf_counter() - start)
        passes += 1
    return chunk_bytes / max(best, 1e-9)


def memory_bandwidth_rates(seconds: float, nbytes: int = 256 * 1024**2) -> list[Rate]:
    """Every way of moving memory tried here, each the best of its repeats.

    A decode step reads the weights once; it writes almost nothing. So a read-only pass
    (on one thread, and on every thread) is measured as well as a copy (which counts its
    read and its write): the floor divides by bandwidth, and must use the fastest the
    machine was seen to move memory, never a slower way. The buffer must dwarf the
    last-level cache (tens of MB on servers) or it measures the cache instead.
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
        return [Rate("bytearray copy (numpy missing)", 2 * nbytes / best)]

    # One buffer, faulted in once by np.ones before any timing: page faults cost about a
    # second per 256 MiB on some VMs. Its halves are copied onto each other.
    buf = np.ones(nbytes // 8, dtype=np.float64)
    per_chunk = max(1, min(CHUNK_BYTES, buf.nbytes // 8) // 8)
    chunks = buf.size // per_chunk
    views = [buf[i * per_chunk : (i + 1) * per_chunk] for i in range(chunks)]
    half = chunks // 2
    chunk_bytes = per_chunk * 8
    size = f"{buf.nbytes // 1024**2} MiB in {chunk_bytes // 1024**2} MiB chunks"
    share = seconds / 3

    def copy(i: int) -> None:
        np.copyto(views[half + i], views[i])

    def read_numpy(i: int) -> None:
        views[i].max()

    rates = [
        Rate(f"numpy copy of {size}", 2 * _best_chunk_rate(half, copy, chunk_bytes, share)),
        Rate(f"numpy read of {size}", _best_chunk_rate(chunks, read_numpy, chunk_bytes, share)),
    ]
    try:
        import torch
    except ImportError:
        return rates
    tensors = [torch.from_numpy(v) for v in views]

    def read_torch(i: int) -> None:
        tensors[i].amax()

    threads = torch.get_num_threads()
    rate = _best_chunk_rate(chunks, read_torch, chunk_bytes, share)
    rates.append(Rate(f"torch read of {size}, {threads} threads", rate))
    return rates


def measure_memory_bandwidth(seconds: float, nbytes: int = 256 * 1024**2) -> tuple[float, str]:
    """The fastest memory traffic measured, bytes per second, and how it was measured."""
    best = max(memory_bandwidth_rates(seconds, nbytes), key=lambda r: r.value)
    return best.value, best.how


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_units(flags: frozenset[str]) -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX on x86, the
    ARMv8.6 BF16 dot products): without them a bf16 matmul is done in float32 FMAs."""
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds each of this process's threads has used (Linux; {} elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    used: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return used
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as fh:
                # The name in parentheses may hold spaces: count fields after it.
                fields = fh.read().rsplit(")", 1)[1].split()
            used[tid] = (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue
    return used


def _busy_threads(before: Mapping[str, float], after: Mapping[str, float]) -> int:
    """Threads that used at least half as much CPU as the busiest one between two
    `_thread_cpu_seconds` readings; 0 where that cannot be told."""
    spent = [after[t] - before.get(t, 0.0) for t in after]
    top = max(spent, default=0.0)
    if top <= 0:
        return 0
    return sum(1 for s in spent if s >= top / 2)


def matmul_rates(seconds: float, n: int = 2048) -> list[Rate]:
    """Peak FLOP/s of every path a CPU engine's linear layers may take here.

    vLLM's CPU backend keeps the model's dtype (bf16 for the embedded model) and calls
    oneDNN, or where oneDNN has no bf16 kernel for this ISA (AVX2 without AVX-512 BF16),
    torch's own linear. Without bf16 units every such kernel computes on the float32
    FMA units, so the float32 rate is the ceiling; with them bf16 is the faster. Both are
    measured and the floor takes the larger. The float32 matmul also runs on one thread,
    scaled by the thread count where it is seen to have used one thread only: on a busy
    host a multi-threaded run waits for its slowest thread, and a floor must not be
    raised by another process's load.
    """
    sizes = [s for s in (256, 512, 1024, 2048, 4096) if s <= max(256, n)]
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError:
        import numpy as np

        def make_np(k: int) -> Callable[[], object]:
            x = np.random.default_rng(0).standard_normal((k, k), dtype=np.float32)
            y = np.random.default_rng(1).standard_normal((k, k), dtype=np.float32)
            return lambda: np.matmul(x, y)

        rate, size = _fastest_rate(make_np, lambda k: 2.0 * k**3, sizes, seconds)
        return [Rate(f"numpy float32 matmul {size}x{size} (torch missing)", rate)]

    def maker(dtype: torch.dtype) -> Callable[[int], Callable[[], object]]:
        def make(k: int) -> Callable[[], object]:
            # Laid out as a linear layer's input and weight: y = x @ w.T.
            x = torch.randn(k, k, dtype=dtype)
            w = torch.randn(k, k, dtype=dtype)
            return lambda: functional.linear(x, w)

        return make

    def flops(k: int) -> float:
        return 2.0 * k**3

    threads = torch.get_num_threads()
    rates: list[Rate] = []
    rate, size = _fastest_rate(maker(torch.float32), flops, sizes, seconds * 0.4)
    rates.append(Rate(f"torch float32 linear {size}x{size}, {threads} threads", rate))
    if threads > 1:
        torch.set_num_threads(1)
        before = _thread_cpu_seconds()
        try:
            rate, size = _fastest_rate(maker(torch.float32), flops, sizes, seconds * 0.25)
        finally:
            torch.set_num_threads(threads)
        # Scaled only where it really ran on one thread: inside vLLM's process the
        # kernels' own pools ignore set_num_threads, and 1 x 2 would count both cores twice.
        if _busy_threads(before, _thread_cpu_seconds()) == 1:
            rates.append(
                Rate(f"torch float32 linear {size}x{size}, 1 thread x {threads}", rate * threads)
            )
        else:
            rates.append(Rate(f"torch float32 linear {size}x{size}, set to 1 thread", rate))
    rate, size = _fastest_rate(maker(torch.bfloat16), flops, sizes, seconds * 0.35)
    rates.append(Rate(f"torch bfloat16 linear {size}x{size}, {threads} threads", rate))
    return rates


def measure_matmul_flops(seconds: float, n: int = 2048) -> tuple[float, str]:
    """The fastest matmul FLOP/s measured (see `matmul_rates`), and how it was measured."""
    best = max(matmul_rates(seconds, n), key=lambda r: r.value)
    return best.value, best.how


def _words(rates: Sequence[Rate], unit: str, scale: float) -> str:
    return "; ".join(f"{r.how}: {r.value / scale:,.1f} {unit}" for r in rates)


def calibrate_cpu(
    seconds_budget: float = 3.0,
    *,
    write_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> HardwareProfile:
    """Measure this machine's CPU and cache the profile.

    Both numbers are the best seen over several ways of measuring (see
    `memory_bandwidth_rates` and `matmul_rates`): the roofline divides by them, so they
    must be the most the machine can do, or a measured step beats its "floor". About a
    third of the budget goes to memory and the rest to matmuls (imports and warm-ups
    come on top). Budgets under a second shrink the buffers so a quick run stays quick.
    `progress`, when given, is told in words what is being measured.
    """
    say = progress or (lambda _words: None)
    budget = max(0.0, seconds_budget)
    small = budget < 1.0
    say("loading torch, to measure the kernels the engine runs…")
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401  (imported once here, so the timings below exclude it)
    say("measuring memory bandwidth (1 of 2)…")
    moved = memory_bandwidth_rates(budget / 3, nbytes=(64 if small else 256) * 1024**2)
    say("measuring matmul speed (2 of 2)…")
    multiplied = matmul_rates(budget * 2 / 3, n=512 if small else 2048)
    bandwidth = max(moved, key=lambda r: r.value)
    flops = max(multiplied, key=lambda r: r.value)
    try:
        load = f"load average {os.getloadavg()[0]:.2f} when measured"
    except (AttributeError, OSError):  # no getloadavg on Windows
        load = "load average unknown"
    memory = total_memory_bytes()
    cores = os.cpu_count() or 0
    units = "with" if bf16_units(cpu_flags()) else "without"
    profile = HardwareProfile(
        name=f"This machine's CPU ({_cpu_model_name()}, {cores} cores)",
        key=CPU_KEY,
        peak_bf16_flops=flops.value,
        mem_bandwidth_bytes_s=bandwidth.value,
        memory_bytes=memory,
        notes=(
            f"measured, the best of each: FLOP/s by {flops.how} ({units} bf16 units; "
            f"{_words(multiplied, 'GFLOP/s', 1e9)}); bandwidth by {bandwidth.how} "
            f"({_words(moved, 'GB/s', 1e9)}); {load}; memory is total RAM (vLLM's CPU "
            "backend budgets from one NUMA node's memory, which can be less)"
        ),
        source=f"calibrate_cpu({seconds_budget:g} s) at {datetime.now(timezone.utc).isoformat()}",
    )
    say(f"measured {flops.value / 1e9:,.1f} GFLOP/s and {bandwidth.value / 1e9:,.1f} GB/s")
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
