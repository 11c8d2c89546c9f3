"""Several `kvscope` commands that stop before an engine serves, run one after another in
one interpreter: vLLM is imported once (9 s of CPU on an AVX2-only EPYC) instead of once
a command, which was most of what each of these cases cost.

Each command gets its own environment, its own engine log (kvscope routes vLLM's log once
a process, so the route is taken down between commands), and its own stdout and stderr at
the file-descriptor level, so that what native code writes (a C++ abort's "terminate
called") is caught as well. An exception that escapes `cli.main.main` is printed as the
interpreter would print it, so "no traceback" is checked as for a process of its own.

    python tests/cli_batch.py CASES.json RESULTS.json

CASES is a list of {"argv": [...], "env": {...}}; RESULTS gets one {"code", "stdout",
"stderr"} per case, in order. Used by tests/test_bad_input.py (`refusals`); a command
that starts an engine and serves, or that a signal stops, runs in a process of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any


def _forget_log_route() -> None:
    """Take down the engine-log handlers the last command installed (engine/vllm/startup
    marks them `_kvscope`), so that this command's log goes to its own cache folder."""
    for name in ("vllm", "py.warnings"):
        log = logging.getLogger(name)
        for handler in list(log.handlers):
            if hasattr(handler, "_kvscope"):
                log.removeHandler(handler)
                handler.close()


def run_one(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    from cli.main import main

    os.environ.clear()
    os.environ.update(env)
    sys.argv[0] = "kvscope"  # argparse's usage lines name the program as a user runs it
    _forget_log_route()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's refusals
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            with contextlib.suppress(ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        return {
            "code": code,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    results = [run_one(c["argv"], c["env"]) for c in cases]
    Path(sys.argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
