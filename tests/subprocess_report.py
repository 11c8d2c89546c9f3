"""Run a script in a fresh Python and read back the JSON it printed after a tag.

Tests that start or break a second vLLM engine do it in their own process, so the
session's shared engine never shares vLLM's process-wide state with them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_helpers import KvscopeProcess, command_env, finish_in_group
from kvscope_zygote import ForkedRun, fresh_reason

ROOT = Path(__file__).resolve().parents[1]


def run_and_report(script: str, tag: str, timeout: float = 300, *, fresh: bool = False) -> Any:
    """`python -c SCRIPT` on the last core, and the JSON after `tag`. Forked from the
    worker's zygote where it can be (as cli_helpers.start_kvscope's runs are), so vLLM is
    imported before SCRIPT runs; `fresh` for a script that checks what it imports."""
    env = command_env()
    argv = [sys.executable, "-c", script]
    proc: KvscopeProcess
    if fresh or fresh_reason(env, prefix=False, what=f"python -c ({tag})"):
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
    else:
        proc = ForkedRun(argv, env, ROOT, stdin=False)
    out_b, err_b = finish_in_group(proc, timeout)
    stdout, stderr = out_b.decode(errors="replace"), err_b.decode(errors="replace")
    line = next((x for x in stdout.splitlines() if x.startswith(tag)), None)
    assert line is not None, f"no {tag} line; stdout: {stdout[-1000:]}\n{stderr[-3000:]}"
    return json.loads(line[len(tag) :])
