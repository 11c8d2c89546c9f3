"""What must hold on a CUDA box, checked on this CPU: no CUDA in kvscope's own process
before vLLM starts, and parallel layouts that cannot run in-process refused in words."""

from __future__ import annotations

import subprocess
import sys
import time
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


@pytest.mark.engine
def test_generate_with_data_parallel_exits_at_once_with_the_advice() -> None:
    began = time.monotonic()
    out = subprocess.run(
        [KVSCOPE, "generate", "--max-tokens", "2", "--data-parallel-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvscope: Bad value for --data-parallel-size: 2 ranks"), lines
    assert "Traceback" not in out.stderr
    # Refused while parsing the flags, before any engine starts (a start is 10 s or more).
    assert took < 60, took
