"""engine/ is a library on its own: importing all of it must not load Textual or tui."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[1]


def test_engine_imports_no_textual() -> None:
    modules = sorted(
        f"engine.{m.name}" for m in pkgutil.iter_modules(engine.__path__) if not m.ispkg
    )
    assert "engine.vllm_engine" in modules and "engine.fake" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'tui'))\n"
        "print('LOADED:' + ','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("LOADED:"))
    assert line == "LOADED:", f"engine/ pulled in: {line}"


def test_tui_does_not_import_vllm_at_module_level() -> None:
    code = (
        "import importlib, pkgutil, sys, tui, tui.widgets, tui.screens\n"
        "for pkg in (tui, tui.widgets, tui.screens):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        if not m.ispkg:\n"
        "            importlib.import_module(pkg.__name__ + '.' + m.name)\n"
        "print('VLLM:' + str('vllm' in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "VLLM:False" in out.stdout
