"""Run a script in a fresh Python and read back the JSON it printed after a tag.

Tests that start or break a second vLLM engine do it in their own process, so the
session's shared engine never shares vLLM's process-wide state with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_and_report(script: str, tag: str, timeout: float = 300) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith(tag)), None)
    assert line is not None, f"no {tag} line; stdout: {out.stdout[-1000:]}\n{out.stderr[-3000:]}"
    return json.loads(line[len(tag) :])
