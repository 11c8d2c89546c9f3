"""Where the roofline's inputs come from: the shipped GPU profiles and model geometries,
local model configs, and for "cpu" this machine's measured profile.

GPU profiles and model geometries ship as JSON in `roofline/data/` (see the `_about` field
of each file for what the numbers are). The "cpu" profile cannot ship: `load_profile`
takes it from `roofline.cpu_calibration`, which measures this machine and caches it.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption

# load_profile calls calibrate_cpu by its name in this module, so a test stands in for the
# seconds-long measurement by patching roofline.hardware.
from roofline.cpu_calibration import calibrate_cpu, load_cached_cpu_profile
from roofline.geometry import ModelGeometry
from roofline.hardware_profile import CPU_KEY, HardwareProfile

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


# --------------------------------------------------------------------------- data files


def _read_data(filename: str) -> dict[str, Any]:
    # importlib.resources finds the file inside an installed wheel as well as a checkout.
    text = resources.files("roofline.data").joinpath(filename).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _norm(name: str) -> str:
    return name.strip().lower()


def _gpu_entries() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = _read_data("hardware.json")["profiles"]
    return entries


def _model_entries() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = _read_data("models.json")["models"]
    return entries


def known_gpus() -> list[str]:
    """Keys `load_profile` accepts, "cpu" last."""
    return [*_gpu_entries(), CPU_KEY]


def known_models() -> list[str]:
    """Keys of the shipped geometries."""
    return list(_model_entries())


def _resolve(name: str, entries: Mapping[str, Mapping[str, Any]], id_field: str) -> str | None:
    """The entry key matching `name` by key, alias or Hugging Face id, ignoring case."""
    wanted = _norm(name)
    for key, entry in entries.items():
        names = [key, *entry.get("aliases", [])]
        if id_field and entry.get(id_field):
            names.append(entry[id_field])
        if wanted in (_norm(n) for n in names):
            return key
    return None


# --------------------------------------------------------------------------- models


def shipped_geometry(key: str) -> ModelGeometry:
    entry = _model_entries()[key]
    return ModelGeometry.from_hf_config(entry["config"], name=entry.get("hf_id", key))


def load_geometry(
    name_or_path: str | os.PathLike[str], *, option: str = "--model"
) -> ModelGeometry:
    """A model's geometry: a shipped name (or alias, or its Hugging Face id, any case), or
    a local model folder or `config.json`.

    Raises BadOption for anything else, listing the shipped names.
    """
    text = os.fspath(name_or_path)
    key = _resolve(text, _model_entries(), "hf_id")
    if key is not None:
        return shipped_geometry(key)

    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise BadOption(option, f"the folder {text!r} has no config.json")
        label = path.resolve().name
    elif path.is_file():
        config_path = path
        label = path.resolve().parent.name
    else:
        raise BadOption(
            option,
            f"unknown model {text!r}; known: {', '.join(known_models())}, "
            "or a local model folder with a config.json",
        )
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadOption(option, f"cannot read {str(config_path)!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise BadOption(option, f"{str(config_path)!r} is not a JSON object")
    try:
        return ModelGeometry.from_hf_config(cfg, name=label)
    except BadOption as exc:
        raise BadOption(option, f"{str(config_path)!r}: {exc.reason}") from None


# --------------------------------------------------------------------------- loading profiles


def load_profile(
    key: str,
    *,
    recalibrate: bool = False,
    seconds_budget: float = 3.0,
    option: str = "--gpu",
    progress: Callable[[str], None] | None = None,
) -> HardwareProfile:
    """A hardware profile by key or alias (any case). "cpu" is this machine, measured:
    from the calibration cache if it is there and was made on this machine, otherwise
    (or with `recalibrate=True`) by `calibrate_cpu`, which refreshes the cache and tells
    `progress` what it measures.
    """
    if _norm(key) == CPU_KEY:
        if not recalibrate:
            cached = load_cached_cpu_profile()
            if cached is not None:
                return cached
        if progress is None:
            return calibrate_cpu(seconds_budget)
        return calibrate_cpu(seconds_budget, progress=progress)

    entries = _gpu_entries()
    found = _resolve(key, entries, "")
    if found is None:
        raise BadOption(option, f"unknown GPU {key!r}; known: {', '.join(known_gpus())}")
    entry = entries[found]
    return HardwareProfile(
        name=entry["name"],
        key=found,
        peak_bf16_flops=float(entry["peak_bf16_flops"]),
        mem_bandwidth_bytes_s=float(entry["mem_bandwidth_bytes_s"]),
        memory_bytes=int(entry["memory_bytes"]),
        notes=entry.get("notes", ""),
        source=entry.get("source", ""),
    )
