"""What must hold on a CUDA box, checked on this CPU: no CUDA in kvscope's own process
before vLLM starts, and parallel layouts that cannot run in-process refused in words."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine.errors import BadOption
from engine.nvml import nvidia_gpu_count

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))


def _fake_nvml(count: int | None) -> types.ModuleType:
    """A stand-in for pynvml: `count` GPUs, or no driver (nvmlInit raises) when None."""
    module = types.ModuleType("pynvml")

    def init() -> None:
        if count is None:
            raise RuntimeError("NVML Shared Library Not Found")

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    return module


@pytest.fixture
def cuda_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any call into torch's CUDA runtime fails the test (cuInit is what forks cannot bear)."""
    import torch

    def forbidden(*_: object, **__: object) -> bool:
        raise AssertionError("CUDA was touched in kvscope's process")

    monkeypatch.setattr(torch.cuda, "is_available", forbidden)
    monkeypatch.setattr(torch.cuda, "init", forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", forbidden)
    monkeypatch.setattr(torch.cuda, "_lazy_init", forbidden)


@pytest.mark.parametrize(("count", "present"), [(2, True), (0, False), (None, False)])
def test_gpu_present_asks_nvml_never_cuda(
    cuda_forbidden: None, monkeypatch: pytest.MonkeyPatch, count: int | None, present: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(count))
    from engine.vllm.options import gpu_present

    assert nvidia_gpu_count() == (count or 0)
    assert gpu_present() is present


def test_gpu_present_without_the_nvml_package(
    cuda_forbidden: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    from engine.vllm.options import gpu_present

    assert gpu_present() is False


def test_in_process_data_parallel_is_refused_with_the_way_to_run_it() -> None:
    from engine.vllm.options import build_engine_settings

    with pytest.raises(BadOption) as caught:
        build_engine_settings(["--data-parallel-size", "2"], prepare=False)
    words = caught.value.plain()
    assert words.startswith("Bad value for --data-parallel-size: 2 ranks cannot run")
    assert "vllm serve MODEL --data-parallel-size 2" in words
    assert "kvscope --url" in words


def test_generate_with_data_parallel_exits_at_once_with_the_advice(tmp_path: Path) -> None:
    # Importing vLLM fails loudly here: the refusal must come before that import (seconds).
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(
        'raise ImportError("kvscope imported vLLM before refusing the input")\n'
    )
    out = subprocess.run(
        [KVSCOPE, "generate", "--max-tokens", "2", "--data-parallel-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    # Refused while parsing the flags, before any engine starts: the poisoned vLLM above
    # proves it (its import would be the one line), whatever the machine's speed.
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvscope: Bad value for --data-parallel-size: 2 ranks"), lines
    assert "Traceback" not in out.stderr
    assert "kvscope imported vLLM" not in out.stderr


# One sample of each GPU start-up failure, in the words the pinned vLLM and torch use.
FREE_MEMORY = (
    "ValueError: Free memory on device cuda:0 (10.47/79.19 GiB) on startup is less than "
    "desired GPU memory utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or "
    "reduce GPU memory used by other processes."
)
FREE_MEMORY_EXTERNAL = (
    "ValueError: Free memory on device cuda:1 (3.00/22.05 GiB) on startup is less than the "
    "engine's budget after excluding external process's weights (0.9, 9.85 GiB). Decrease "
    "GPU memory utilization or reduce GPU memory used by other processes."
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 22.05 GiB of which 1.12 GiB is free. Including non-PyTorch memory, "
    "this process has 20.91 GiB memory in use. Of the allocated memory 20.1 GiB is "
    "allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated."
)
WARMUP_OOM = (
    "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy "
    "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
    "initializing the engine."
)
BF16 = (
    "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least "
    "8.0. Your Tesla T4 GPU has compute capability 7.5. You can use float16 instead by "
    "explicitly setting the `dtype` flag in CLI, for example: --dtype=half."
)
NO_CC = (
    "RuntimeError: Failed to find C compiler. Please specify via CC environment variable "
    "or set triton.knobs.build.impl."
)
NO_HEADERS = (
    "torch._inductor.exc.InductorError: CppCompileError: C++ compile error\n"
    "/tmp/torchinductor_root/ab/cab.cpp:1:10: fatal error: Python.h: No such file or directory"
)


def _mapped(text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    import engine.vllm.startup as startup
    from engine.nvml import GpuProcess

    held = [GpuProcess(0, 4242, "vllm", 68 * 1024**3)]
    monkeypatch.setattr(startup, "gpu_processes", lambda: held)
    error = startup.map_start_error(
        RuntimeError(text.split(": ", 1)[1]),
        model="Qwen/Qwen2.5-7B-Instruct",
        max_model_len=None,
        kv_bytes_per_token=None,
        block_size=None,
        kv_cache_memory_bytes=None,
    )
    return f"{type(error).__name__}: {error.plain()}"


@pytest.mark.parametrize(
    ("text", "kind", "says"),
    [
        (
            FREE_MEMORY,
            "DeviceMemoryTaken",
            (
                "cuda:0 has 10.47 of 79.19 GiB free",
                "--gpu-memory-utilization 0.92 asks for (72.85 GiB)",
                "Held by pid 4242 vllm (GPU 0, 68.0 GiB)",
                "kvscope --url",
                "--gpu-memory-utilization 0.12 or less",
            ),
        ),
        (FREE_MEMORY_EXTERNAL, "DeviceMemoryTaken", ("cuda:1 has 3.00 of 22.05 GiB free",)),
        (
            CUDA_OOM,
            "DeviceOutOfMemory",
            ("tried to allocate 2.00 GiB", "GPU 0 had 1.12 GiB free of 22.05 GiB", "pid 4242"),
        ),
        (WARMUP_OOM, "DeviceOutOfMemory", ("memory to warm up the sampler",)),
        (BF16, "DeviceTooOld", ("the Tesla T4 has compute capability 7.5", "--dtype half")),
        (NO_CC, "CompilerMissing", ("no C compiler", "--enforce-eager")),
        (NO_HEADERS, "CompilerMissing", ("Python.h", "--enforce-eager")),
    ],
)
def test_gpu_start_errors_are_said_in_words_with_vllms_figures(
    monkeypatch: pytest.MonkeyPatch, text: str, kind: str, says: tuple[str, ...]
) -> None:
    words = _mapped(text, monkeypatch)
    assert words.startswith(f"{kind}: "), words
    for part in says:
        assert part in words, (part, words)


def test_a_missing_file_is_the_model_only_when_it_is_the_models_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A library that will not load is a missing file too; it is not "Model not found".
    library = "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"
    assert _mapped(library, monkeypatch).startswith("EngineStartFailed: ")
    missing = "OSError: [Errno 2] No such file or directory: 'Qwen/Qwen2.5-7B-Instruct/config.json'"
    assert _mapped(missing, monkeypatch).startswith("ModelNotFound")
