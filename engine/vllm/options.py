"""Engine options are vLLM's own flags; kvscope only changes defaults for the CPU, and for
the embedded model on a GPU.

Parsing imports vLLM, so callers that only need `--help` for kvscope's own flags never
come here.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption, ModelNotFound, UnknownFlag
from engine.nvml import gpu_devices, nvidia_gpu_count

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

MIB = 1024**2
# Enough for one full 8,192-token request of the embedded model (23,040 B/token) plus
# room for a few shorter ones; small enough to fill with the concurrency control.
CPU_DEFAULT_KV_BYTES = 256 * MIB
# On the CPU backend this fraction applies to one NUMA node's memory, and vLLM refuses
# to start when the node cannot give it (0.92 fails on these 2-core machines).
CPU_DEFAULT_MEMORY_UTILIZATION = 0.5
# On a GPU, vLLM's default gives the KV pool 0.92 of the device: for the embedded 135M model
# that is a pool of millions of tokens (no wall to walk into) and a GPU nobody else can use.
# It gets the CPU's pool instead, so it meets the same walls on both.
GPU_EMBEDDED_KV_BYTES = CPU_DEFAULT_KV_BYTES
# With a fixed pool, --gpu-memory-utilization only sets vLLM's start-up check (free memory
# at least that share of the device). The embedded model needs its pool plus well under
# this (weights 0.27 GB, activations, CUDA graphs, the CUDA context), so it starts beside a
# `vllm serve` that holds the rest of the GPU.
GPU_EMBEDDED_OVERHEAD_BYTES = 4 * 1024**3


@dataclass
class EngineSettings:
    """What VllmEngine needs: vLLM's EngineArgs plus where the model came from."""

    engine_args: Any  # vllm.engine.arg_utils.EngineArgs
    model_label: str
    embedded: bool
    on_gpu: bool


def vllm_parser(prog: str = "kvscope") -> argparse.ArgumentParser:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _Parser(FlexibleArgumentParser):
        # argparse would print and exit; kvscope reports it like any other bad option,
        # also from a worker thread inside the UI.
        def error(self, message: str) -> None:  # type: ignore[override]
            raise flag_error(message)

    parser = _Parser(prog=prog, description="vLLM engine options")  # type: ignore[no-untyped-call]
    EngineArgs.add_cli_args(parser)
    return parser


def flag_error(message: str) -> BadOption | UnknownFlag:
    """argparse's complaint as a typed error naming the flag, in one line."""
    unknown = re.match(r"unrecognized arguments: (.+)", message)
    if unknown:
        return UnknownFlag(unknown.group(1))
    about = re.match(r"argument ([^:]+): (.+)", message)
    if about:
        return BadOption(about.group(1).split("/")[0], about.group(2))
    return BadOption("engine flags", message)


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is here, asked of NVML: never of torch, which would initialise
    CUDA in this process and leave vLLM's forked workers unable to use it."""
    return nvidia_gpu_count() > 0


def refuse_in_process_data_parallel(ns: argparse.Namespace) -> None:
    """Data-parallel ranks need vLLM's own processes: in kvscope's process, LLMEngine waits
    for peer ranks that never come (vLLM's `LLM()` refuses it too). Say how to run it."""
    dp = int(ns.data_parallel_size or 1)
    if dp > 1:
        raise BadOption(
            "--data-parallel-size",
            f"{dp} ranks cannot run inside kvscope's process (vLLM would wait for peer "
            f"ranks that never start); run `vllm serve MODEL --data-parallel-size {dp}`, "
            "then `kvscope --url http://HOST:PORT`",
        )


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or not _HF_ID.match(model)


def check_model_reference(model: str) -> None:
    """Fail fast, in plain words, on a model that cannot be found.

    A Hugging Face ID is "owner/name"; anything else is taken as a local path.
    """
    expanded = os.path.expanduser(model)
    if os.path.exists(expanded):
        if os.path.isdir(expanded) and not os.path.isfile(os.path.join(expanded, "config.json")):
            raise ModelNotFound(model, "the folder has no config.json")
        return
    if _looks_like_path(model):
        raise ModelNotFound(model, "no such file or folder")


# Where vLLM 0.32's parser default differs from EngineArgs' own (tests/test_options.py
# fails when a vLLM upgrade changes this list).
_PARSER_DEFAULTS: dict[str, object] = {
    "enable_lora": None,
    "mm_device_do_normalize": None,
    "reasoning_parser_plugin": "",
}


def build_engine_settings(
    argv: Sequence[str],
    progress: Any = None,
    *,
    prepare: bool = True,
    check: Callable[[argparse.Namespace], None] | None = None,
) -> EngineSettings:
    """Turn vLLM flags into EngineArgs with kvscope's CPU (or embedded-on-GPU) defaults.

    `progress(stage, fraction)` is told about the embedded model's one-time conversion.
    `check(namespace)` sees the parsed flags first, so a command can refuse its own
    inputs against them (a prompt past --max-model-len) before anything is built.
    """
    from vllm.engine.arg_utils import EngineArgs

    if argv:
        parser = vllm_parser()
        ns = parser.parse_args(list(argv))
        given = _given_dests(parser, argv)
    else:
        # No flags: EngineArgs' own defaults are what the parser would give, and building
        # vLLM's full parser costs 0.5-0.8 s of every start (test_options checks they agree).
        ns = argparse.Namespace(**{**vars(EngineArgs()), **_PARSER_DEFAULTS})
        given = set()
    refuse_in_process_data_parallel(ns)
    if check is not None:
        check(ns)
    embedded = "model" not in given
    if embedded:
        from engine.model_prep import EMBEDDED_MODEL_NAME, prepare_embedded_model

        if prepare:
            ns.model = str(prepare_embedded_model(progress))
        label = EMBEDDED_MODEL_NAME
    else:
        check_model_reference(ns.model)
        label = ns.model.rstrip("/").split("/")[-1] if os.path.exists(ns.model) else ns.model
    if "use_tqdm_on_load" not in given:
        # A progress bar on stderr tears the terminal UI and clutters headless output.
        ns.use_tqdm_on_load = False
    if "enable_mfu_metrics" not in given:
        # vLLM's own count of each step's FLOPs and bytes, which the live roofline draws
        # (engine/vllm/internals.py reads it per step); --no-enable-mfu-metrics turns it
        # off. It is arithmetic on the scheduled tokens, no device is touched.
        ns.enable_mfu_metrics = True
    on_gpu = gpu_present()
    if on_gpu and embedded:
        _embedded_gpu_defaults(ns, given)
    if not on_gpu:
        if "enforce_eager" not in given:
            ns.enforce_eager = True  # torch.compile warm-up costs ~2 min on 2 cores
        if "kv_cache_memory_bytes" not in given and "num_gpu_blocks_override" not in given:
            ns.kv_cache_memory_bytes = CPU_DEFAULT_KV_BYTES
        if "gpu_memory_utilization" not in given:
            ns.gpu_memory_utilization = CPU_DEFAULT_MEMORY_UTILIZATION
    engine_args = EngineArgs.from_cli_args(ns)
    return EngineSettings(engine_args, label, embedded, on_gpu)


def embedded_gpu_utilization(total_bytes: int, kv_bytes: int) -> float:
    """The share of a GPU of `total_bytes`, in whole hundredths, that covers the embedded
    model with a pool of `kv_bytes` (0.04 of an H200, 0.19 of an L4 for 256 MiB)."""
    need = GPU_EMBEDDED_OVERHEAD_BYTES + kv_bytes
    return min(max(math.ceil(need / total_bytes * 100) / 100, 0.01), 0.92)


def _embedded_gpu_defaults(ns: argparse.Namespace, given: set[str]) -> None:
    """The embedded model on a GPU: a fixed pool, and a start-up check sized to what it
    takes. A flag the user gave about the pool's size is theirs: vLLM's defaults then."""
    pool_flags = {"kv_cache_memory_bytes", "num_gpu_blocks_override", "gpu_memory_utilization"}
    if not pool_flags & given:
        ns.kv_cache_memory_bytes = GPU_EMBEDDED_KV_BYTES
    devices = gpu_devices()
    # Only a fixed pool leaves the fraction to the check alone; a profiled pool (vLLM's
    # default, or --num-gpu-blocks-override) is sized from it.
    if ns.kv_cache_memory_bytes and "gpu_memory_utilization" not in given and devices:
        # The largest device, so that the check asks no GPU for more than the footprint.
        ns.gpu_memory_utilization = embedded_gpu_utilization(
            max(d.total_bytes for d in devices), int(ns.kv_cache_memory_bytes)
        )


def _given_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Which options the user wrote, whatever their value (vLLM accepts - and _)."""
    written = {a.split("=", 1)[0].replace("_", "-") for a in argv if a.startswith("-")}
    dests = set()
    for action in parser._actions:
        for opt in action.option_strings:
            base = opt.replace("_", "-")
            if base in written or base.replace("--", "--no-", 1) in written:
                dests.add(action.dest)
    return dests
