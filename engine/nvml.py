"""NVIDIA GPUs seen through NVML (nvidia-ml-py), never through CUDA.

kvscope's own process must not initialise CUDA before vLLM starts: vLLM forks its
tensor-parallel workers unless CUDA is already initialised, and a forked child cannot use
CUDA then. `torch.cuda.is_available()` runs `cuInit`; NVML reads the driver without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.byte_size import figure, in_unit

_lock = threading.Lock()


def _gib(num_bytes: float) -> str:
    """GPU memory in the unit nvidia-smi's readers think in: "79.2 GiB"."""
    return in_unit(num_bytes, "GiB", 1, grouped=True)


def _gib_figure(num_bytes: float) -> str:
    """The same figure without its unit, for "20.0 of 24.0 GiB", which names it once."""
    return figure(num_bytes, "GiB", 1, grouped=True)


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
        used = f", {_gib(self.used_bytes)}" if self.used_bytes else ""
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
    """One GPU, or one MIG slice of one, as CUDA will see it.

    `index` is NVML's number for the physical GPU (what nvidia-smi and `GpuProcess.gpu`
    say). `cuda` is the number CUDA gives the device under CUDA_VISIBLE_DEVICES (cuda:0 is
    the first device vLLM uses); None where that variable is unset, and NVML's order is
    CUDA's with one kind of GPU (or CUDA_DEVICE_ORDER=PCI_BUS_ID). A MIG slice has its own
    memory, which is what vLLM's start-up check measures on it.
    """

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    cuda: int | None = None
    mig_uuid: str | None = None  # "MIG-..." where this is a MIG slice

    def where(self) -> str:
        """ "GPU 1", "cuda:0 = GPU 1", or "MIG slice MIG-... of GPU 0"."""
        place = f"GPU {self.index}"
        if self.mig_uuid is not None:
            place = f"MIG slice {self.mig_uuid} of {place}"
        if self.cuda is not None and (self.cuda != self.index or self.mig_uuid is not None):
            place = f"cuda:{self.cuda} = {place}"
        return place

    def words(self) -> str:
        return (
            f"{self.where()} {self.name}: {_gib_figure(self.free_bytes)} of "
            f"{_gib(self.total_bytes)} free"
        )


@dataclass(frozen=True, slots=True)
class GpuView:
    """The GPUs CUDA will use, in CUDA's order, and the driver they run under."""

    devices: tuple[GpuDevice, ...] = ()
    notes: tuple[str, ...] = ()  # why a GPU NVML sees is left out, or may be numbered apart
    nvml_count: int = 0  # every GPU NVML sees, visible or not
    driver: str | None = None  # "550.54.15"
    driver_cuda: tuple[int, int] | None = None  # (12, 4): the newest CUDA this driver runs


def _text(value: Any) -> str:
    # nvidia-ml-py gives str; releases before 11.5 gave bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class _Physical:
    """One GPU in NVML's order, with its MIG slices (handle, UUID) where MIG is on."""

    index: int
    handle: Any
    uuid: str
    slices: tuple[tuple[Any, str], ...]


def _mig_slices(nvml: Any, handle: Any) -> tuple[tuple[Any, str], ...]:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:
        return ()  # NVMLError_NotSupported: a GPU without MIG (an L4, anything before A100)
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return ()
    found: list[tuple[Any, str]] = []
    for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:
            continue  # NVMLError_NotFound: a slot with no slice in it
        found.append((mig, _text(nvml.nvmlDeviceGetUUID(mig))))
    return tuple(found)


def _device(nvml: Any, index: int, handle: Any, cuda: int | None, mig: str | None) -> GpuDevice:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    name = _text(nvml.nvmlDeviceGetName(handle))
    return GpuDevice(index, name, int(memory.total), int(memory.free), cuda, mig)


def _whole_or_slices(nvml: Any, gpu: _Physical, cuda: int | None) -> list[GpuDevice]:
    """A GPU picked by its index or UUID: itself, or with MIG on, each of its slices (CUDA
    never runs on the whole of a GPU in MIG mode)."""
    if not gpu.slices:
        return [_device(nvml, gpu.index, gpu.handle, cuda, None)]
    return [_device(nvml, gpu.index, h, None, uuid) for h, uuid in gpu.slices]


def _by_prefix(wanted: str, uuids: list[str]) -> int | None:
    # CUDA takes any prefix of a UUID that names one device alone.
    hits = [i for i, u in enumerate(uuids) if u.startswith(wanted)]
    return hits[0] if len(hits) == 1 else None


def _visible(
    nvml: Any, gpus: list[_Physical], setting: str | None
) -> tuple[list[GpuDevice], list[str]]:
    """The devices CUDA_VISIBLE_DEVICES leaves CUDA, in its order; and what was left out."""
    if setting is None:
        found = [d for g in gpus for d in _whole_or_slices(nvml, g, None)]
        return found, _mig_notes(gpus)
    if not setting.strip():
        return [], [f"CUDA_VISIBLE_DEVICES is empty: CUDA sees none of the {len(gpus)} GPUs"]
    found = []
    notes: list[str] = []
    taken: set[str] = set()  # one per device CUDA numbers: cuda:N is the Nth
    split: list[_Physical] = []  # GPUs named whole that are in MIG mode
    slices = [(g, h, u) for g in gpus for h, u in g.slices]
    for entry in (e.strip() for e in setting.split(",")):
        gpu: _Physical | None = None
        pick: list[GpuDevice] = []
        if re.fullmatch(r"\d+", entry) and int(entry) < len(gpus):
            gpu = gpus[int(entry)]
        elif entry.startswith("GPU-"):
            at = _by_prefix(entry, [g.uuid for g in gpus])
            gpu = gpus[at] if at is not None else None
        elif entry.startswith("MIG-"):
            at = _by_prefix(entry, [u for _, _, u in slices])
            if at is not None:
                g, h, u = slices[at]
                pick = [_device(nvml, g.index, h, len(taken), u)]
        if gpu is not None:
            pick = _whole_or_slices(nvml, gpu, len(taken))
        if not pick:
            # CUDA stops reading the list at the first entry that names no device.
            notes.append(
                f"CUDA_VISIBLE_DEVICES={setting}: {entry!r} names no GPU NVML sees, so CUDA "
                "ignores it and every entry after it"
            )
            break
        key = pick[0].mig_uuid if gpu is None else f"GPU {gpu.index}"
        if key in taken:
            continue  # named twice: still one device
        taken.add(str(key))
        if gpu is not None and gpu.slices:
            split.append(gpu)
        found.extend(pick)
    hidden = len(gpus) - len({d.index for d in found})
    if hidden:
        notes.append(f"CUDA_VISIBLE_DEVICES={setting} hides {hidden} of the {len(gpus)} GPUs")
    return found, notes + _mig_notes(split)


def _mig_notes(gpus: list[_Physical]) -> list[str]:
    return [
        f"GPU {g.index} is split into {len(g.slices)} MIG slices: CUDA runs on a slice, not "
        f"the whole GPU; choose one with CUDA_VISIBLE_DEVICES={g.slices[0][1]}"
        for g in gpus
        if g.slices
    ]


def _order_note(devices: list[GpuDevice]) -> list[str]:
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML numbers
    # them by PCI bus. With one kind of GPU the two agree (vLLM warns the same way).
    kinds = {d.name for d in devices if d.mig_uuid is None}
    if len(kinds) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return [
            "GPUs of different kinds: set CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA "
            "numbers them as NVML does"
        ]
    return []


def _driver(nvml: Any) -> tuple[str | None, tuple[int, int] | None]:
    try:
        version: str | None = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception:
        version = None
    try:
        # 12040 means CUDA 12.4: the newest CUDA runtime this driver can run.
        code = int(nvml.nvmlSystemGetCudaDriverVersion())
        cuda: tuple[int, int] | None = (code // 1000, code % 1000 // 10)
    except Exception:
        cuda = None
    return version, cuda


def gpu_view() -> GpuView:
    """The GPUs CUDA will use (CUDA_VISIBLE_DEVICES read as CUDA reads it: indices,
    GPU-UUIDs, MIG-UUIDs), each MIG slice with its own memory, and the driver's version and
    CUDA version; an empty view without NVML."""
    nvml = _nvml()
    if nvml is None:
        return GpuView()
    try:
        driver, driver_cuda = _driver(nvml)
        gpus: list[_Physical] = []
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(_maybe(lambda h=handle: nvml.nvmlDeviceGetUUID(h)) or "")
                gpus.append(_Physical(index, handle, uuid, _mig_slices(nvml, handle)))
            devices, notes = _visible(nvml, gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        except Exception as exc:
            return GpuView(
                notes=(f"NVML failed while listing GPUs ({type(exc).__name__})",),
                nvml_count=len(gpus), driver=driver, driver_cuda=driver_cuda,
            )  # fmt: skip
        return GpuView(
            tuple(devices), tuple(notes + _order_note(devices)), len(gpus), driver, driver_cuda
        )
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def gpu_devices() -> list[GpuDevice]:
    """The GPUs CUDA will use, in CUDA's order, with their total and free memory (a MIG
    slice's own); [] without NVML."""
    return list(gpu_view().devices)


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
        mem = f"{_gib_figure(self.used_bytes)} of {_gib(self.total_bytes)}"
        split = ""
        if self.ours_bytes is not None:
            split = f" (kvscope {_gib_figure(self.ours_bytes)}"
            split += f", others {_gib_figure(self.others_bytes or 0)})"
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
