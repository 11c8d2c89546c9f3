"""`kvscope` runs forked from the tests' zygote (tests/zygote_server.py): a process of its
own, as a user's, that skips the ~9 s of CPU a fresh one spends importing vLLM.

`ForkedRun` has the part of subprocess.Popen's interface the tests use (pid, the three
streams, poll, wait, communicate, signals), so `cli_helpers.start_kvscope` hands out one
or the other. A run goes through the zygote only where that cannot change what it does:
  - its environment equals the zygote's but for variables kvscope's own code reads when
    it runs (KVSCOPE_*): anything else could have been read by an import;
  - no wrapper command (`unshare ...`) comes before `kvscope`.
A zygote is started per environment (up to MAX_ZYGOTES per worker). Else, and with
KVSCOPE_TEST_ZYGOTE=0, a run is a fresh process (`fresh_reason` says why).
"""

from __future__ import annotations

import array
import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("zygote_server.py")
RUNTIME_ONLY = ("KVSCOPE_", "PYTEST_CURRENT_TEST")
"""Prefixes of the variables no import reads (kvscope's own, read by its code after the
fork; pytest's name of the running test): a run whose environment differs from a zygote's
in these alone is what a fresh process would be."""
START_TIMEOUT_S = 300.0


class Zygote:
    """A zygote process, started in one environment on first use, ended with the worker."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] | None = None) -> None:
        """Started in `env`, importing zygote_server.PRELOAD, or `preload` if given."""
        self.env = env
        folder = Path(tempfile.mkdtemp(prefix="kvscope-zygote-"))
        self.path = str(folder / "sock")
        self.log = folder / "zygote.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVER), self.path, *([",".join(preload)] if preload else [])],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        atexit.register(self.end)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline().decode() if ready else ""
        kind, _, rest = line.strip().partition(" ")
        self.unsafe = "" if kind == "ready" else (rest or f"no answer: {self.tail()}")
        changes = json.loads(rest.partition(" ")[2]) if kind == "ready" else {}
        self.set_by_imports: dict[str, str] = changes.get("set", {})
        self.unset_by_imports: list[str] = changes.get("unset", [])

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        """Ask it to leave: it does once the runs it forked have ended."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def end(self) -> None:
        """At the worker's exit: closed, and killed if still there after 10 s."""
        self.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` as a fresh process would have it once the zygote's imports ran: what they
        set included (the same start as the zygote's gives the same result)."""
        out = {**env, **self.set_by_imports}
        for name in self.unset_by_imports:
            out.pop(name, None)
        return out


MAX_ZYGOTES = 3
"""Per test worker, the most alive at once: a new one ends the one asked for the longest
time ago. Three: a worker's runs come in its own environment and in one or two of a
test's (another HOME, a PYTHONPATH), and an environment's first run starts its zygote."""
_zygotes: dict[frozenset[tuple[str, str]], Zygote] = {}
_set_by_imports: dict[str, str] = {}
"""What the zygotes' own imports set (each one's ready line says): vLLM, torch and
transformers put these in the environment of whatever process imports them, a test
worker's too, so the worker's environment has them once a test there imported vLLM."""


def import_env(env: dict[str, str]) -> frozenset[tuple[str, str]]:
    """The part of `env` an import could read: all but the RUNTIME_ONLY variables, and but
    the variables that hold what the imports themselves set (`_set_by_imports`). Such an
    environment is the zygote's: its imports set them to these very values, and a fork runs
    with them (`Zygote.child_env`). Without this, the worker's first in-process vLLM import
    made every later run's environment new: a second zygote, and fresh runs until it came
    (fresh clone P: four more fresh imports in one worker, about 10 s of CPU each)."""
    return frozenset(
        (k, v)
        for k, v in env.items()
        if not k.startswith(RUNTIME_ONLY) and _set_by_imports.get(k) != v
    )


def zygote_for(env: dict[str, str]) -> Zygote:
    """The zygote of this environment, started the first time a run asks for it. A zygote
    costs what a fresh start costs, so an environment that a single run has loses nothing
    but the fork's exit (about 2 s); the first run's zygote also says what its imports set,
    and without that a worker's in-process vLLM import (its session engine) between its
    first run and its second made the second's environment new (fresh clone S: two fresh
    runs and a zygote in one worker, where one zygote does)."""
    key = import_env(env)
    if key in _zygotes:
        _zygotes[key] = _zygotes.pop(key)  # the most recently asked for comes last
    else:
        # One that would not fork (its imports failed: a test hid vLLM) holds nothing and
        # is kept, so that environment's runs do not start it again.
        while len(live := [k for k, z in _zygotes.items() if not z.unsafe]) >= MAX_ZYGOTES:
            _zygotes.pop(live[0]).close()
        _zygotes[key] = zygote = Zygote(dict(key))
        _set_by_imports.update(zygote.set_by_imports)
    return _zygotes[key]


def fresh_reason(env: dict[str, str], prefix: bool, what: str = "") -> str:
    """Why this run must be a fresh process; "" when a zygote can fork it. With
    KVSCOPE_TEST_ZYGOTE_LOG=FILE, each answer is added to FILE (`what`: the command)."""
    reason = _fresh_reason(env, prefix)
    if log := os.environ.get("KVSCOPE_TEST_ZYGOTE_LOG"):
        with open(log, "a", errors="backslashreplace") as f:
            last = reason.strip().splitlines()[-1] if reason.strip() else "forked"
            f.write(f"{os.getpid()}\t{what[:60]}\t{last}\n")
    return reason


def _fresh_reason(env: dict[str, str], prefix: bool) -> str:
    if os.environ.get("KVSCOPE_TEST_ZYGOTE") == "0":
        return "KVSCOPE_TEST_ZYGOTE=0"
    if prefix:
        return "a wrapper command comes first"
    zygote = zygote_for(env)
    if zygote.unsafe:
        return f"the zygote does not fork: {zygote.unsafe}"
    if zygote.proc.poll() is not None:
        return f"the zygote ended: {zygote.tail()}"
    return ""


class ForkedRun:
    """A `kvscope` run forked by the zygote, as subprocess.Popen would show it: its pid
    (the leader of its own session), stdin (a pipe, or /dev/null), stdout and stderr
    (pipes), and its exit status, which the zygote (its parent) reports."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        stdin: bool,
        zygote: Zygote | None = None,
    ) -> None:
        """Forked by `zygote`, or by the one of `env` (`fresh_reason` said there is one)."""
        zygote = zygote or _zygotes.get(import_env(env))
        assert zygote is not None, "ForkedRun after fresh_reason said no"
        self._zygote = zygote
        self.args = argv
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = None
        theirs: list[int] = []
        if stdin:
            read, write = os.pipe()
            self.stdin = open(write, "wb")  # noqa: SIM115 - closed by communicate
            theirs.append(read)
        else:
            theirs.append(os.open(os.devnull, os.O_RDONLY))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.stdout: IO[bytes] | None = open(out_r, "rb")  # noqa: SIM115
        self.stderr: IO[bytes] | None = open(err_r, "rb")  # noqa: SIM115
        theirs += [out_w, err_w]
        self._out_fd, self._err_fd = out_r, err_r
        request = {
            "argv": argv,
            "env": self._zygote.child_env(env),
            "cwd": str(cwd),
            # A fresh process would keep what this one ignores (zygote_server.become).
            "ignored": [int(s) for s in signal.Signals if signal.getsignal(s) == signal.SIG_IGN],
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(self._zygote.path)
        self._sock.sendmsg(
            [json.dumps(request).encode()],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))],
        )
        for fd in theirs:  # the fork holds them now: EOF comes when it (and its own) end
            os.close(fd)
        self._said = b""
        self.pid = int(self._line("pid", START_TIMEOUT_S))

    def _line(self, kind: str, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._said:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            chunk = self._sock.recv(4096)
            assert chunk, f"the zygote went away: {self._zygote.tail()}"
            self._said += chunk
        line, _, self._said = self._said.partition(b"\n")
        said, _, value = line.decode().partition(" ")
        assert said == kind, (said, kind)
        return value

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.wait(0)
            except subprocess.TimeoutExpired:
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = int(self._line("exit", timeout))
            self.returncode = os.waitstatus_to_exitcode(status)
            self._sock.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes, bytes]:
        """Popen.communicate: `input` to stdin (then closed), stdout and stderr read to
        their end, then the exit; subprocess.TimeoutExpired after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        reading = {f.fileno(): f for f in (self.stdout, self.stderr) if f and not f.closed}
        got: dict[int, list[bytes]] = {fd: [] for fd in reading}
        writing = self.stdin if self.stdin is not None and not self.stdin.closed else None
        to_send = memoryview(input or b"")
        if writing is not None and not to_send:
            writing.close()
            writing = None
        while reading or writing is not None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            wanted = [writing] if writing is not None else []
            ready, can_write, _ = select.select(list(reading), wanted, [], left)
            if writing is not None and can_write:
                try:
                    to_send = to_send[os.write(writing.fileno(), to_send[:65536]) :]
                except BrokenPipeError:
                    to_send = to_send[:0]  # it stopped reading: as Popen, not an error
                if not to_send:
                    writing.close()
                    writing = None
            for fd in ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    got[fd].append(chunk)
                else:
                    reading.pop(fd).close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        out = b"".join(got[self._out_fd]) if self._out_fd in got else b""
        err = b"".join(got[self._err_fd]) if self._err_fd in got else b""
        return out, err
