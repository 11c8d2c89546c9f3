"""The playground needs a terminal: said in one line when it has none, before it starts.

Textual reads keys from stdin and draws on stdout. With stdin closed it fails on its
first read (`OSError: [Errno 9]`); with stdin at /dev/null or a pipe it runs with no way
to quit; with stdout in a file, the screen is drawn into the file.
"""

from __future__ import annotations

import os
import sys

from engine.errors import KvscopeError


class NoTerminal(KvscopeError):
    def __init__(self, what: str, why: str) -> None:
        super().__init__(what, why)
        self.what = what
        self.why = why

    def plain(self) -> str:
        return (
            f"{self.what} needs a terminal, but {self.why}. Run it in a terminal; headless, "
            "use --screenshot OUT.svg, or `kvscope generate` / `kvscope bench`."
        )


_closed_at_start: set[str] = set()


def stdin_was_closed() -> None:
    """Python leaves `sys.stdin` None when the process starts with fd 0 closed: give it
    /dev/null, so that a read finds nothing instead of an AttributeError, and remember
    it for `require_terminal`'s words."""
    _closed_at_start.add("stdin")
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 (for the whole run)


def _stream_problem(name: str, fd: int, stream: object) -> str | None:
    if stream is None or name in _closed_at_start:
        return f"{name} is closed"
    try:
        os.fstat(fd)
    except OSError:
        return f"{name} is closed"
    if not os.isatty(fd):
        return f"{name} is not a terminal (a file, a pipe or /dev/null)"
    return None


def require_terminal(what: str) -> None:
    """Raise NoTerminal unless stdin and stdout are both a terminal."""
    problem = _stream_problem("stdin", 0, sys.stdin) or _stream_problem("stdout", 1, sys.stdout)
    if problem is not None:
        raise NoTerminal(what, problem)
