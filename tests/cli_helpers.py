"""The kvscope command as the tests run it: this venv's executable, and its one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
"""This venv's `kvscope`, for tests that run the command as a user would."""

READY = "kvscope: engine ready:"
"""How the line starts that a command prints once its engine is up: progress, not an error."""


def one_line(err: str, *says: str, besides: tuple[str, ...] = ()) -> str:
    """The one `kvscope:` line on stderr `err`, which must say each of `says`.

    Blank lines, the engine's ready line and lines that start with one of `besides` (a
    test's own report) are not counted. A traceback or a C++ abort fails the test.
    """
    assert "Traceback" not in err, err[-3000:]
    assert "terminate called" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith((READY, *besides))]
    assert len(lines) == 1 and lines[0].startswith("kvscope: "), lines
    for said in says:
        assert said in lines[0], (said, lines[0])
    return lines[0]
