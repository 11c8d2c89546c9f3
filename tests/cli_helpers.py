"""The kvscope command as the tests run it: this venv's executable, run in a process group
of its own that must be gone when it exits, and its one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from kvscope_zygote import ForkedRun, fresh_reason

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[1]
KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
"""This venv's `kvscope`, for tests that run the command as a user would."""
NO_VLLM_FLAGS = frozenset({"--fake", "--url", "--replica", "--compare-urls", "--prefill"})
"""A command with one of these runs no vLLM in its process (cli/engine_choice.py: the fake
engine, or servers over HTTP; tests/test_bad_input_attach.py runs them with vLLM hidden).
It runs fresh: a fork's exit collects all the zygote imported, which costs more than the
imports such a command makes (measured one at a time on the 2-core EPYC: `bench --fake`
3.6 s forked, 1.4 s fresh; `generate --url` to a closed port 2.5 s forked, 0.4 s fresh)."""

QUIET = {"TORCH_CPP_LOG_LEVEL": "ERROR", "TQDM_DISABLE": "1"}
"""What `cli.launch.quiet_native_warnings` sets in kvscope's environment. Given to every
run, so a run's environment is the same before and after a test ran kvscope's code in the
worker itself (which sets them there): one zygote, not two (tests/kvscope_zygote.py)."""

READY = "kvscope: engine ready:"
"""How the line starts that a command prints once its engine is up: progress, not an error."""


def command_env(**extra: str) -> dict[str, str]:
    """The environment a test gives a `kvscope` run: this one (one OpenMP thread: see
    tests/conftest.py), with what kvscope sets in its own (`quiet_native_warnings`), no
    debug output; `extra` on top."""
    env = {**os.environ, **QUIET, **extra}
    env.pop("KVSCOPE_DEBUG", None)
    return env


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


def assert_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """Nothing of the command may outlive it: not the engine, not a helper process. What
    is still there after `timeout_s` is killed, and the test fails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"processes of group {pgid} outlived kvscope")


class KvscopeProcess(Protocol):
    """What the tests use of a `kvscope` run: subprocess.Popen's, or a zygote's fork's."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...
    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes, bytes]: ...


def start_kvscope(
    *args: str,
    env: dict[str, str],
    stdin: bool = False,
    prefix: Sequence[str] = (),
    fresh: bool = False,
) -> KvscopeProcess:
    """`kvscope ARGS` (after `prefix`, a wrapper such as `unshare`) from the repository
    root, in a session of its own (its own process group, to look for leftovers), with
    stdout and stderr piped; stdin piped too with `stdin`, else /dev/null.

    Forked from the worker's zygote (tests/kvscope_zygote.py: vLLM already imported)
    where that runs the same command as a fresh process would; else a fresh process.
    `fresh` for a command that never imports vLLM (a refusal of its flags): a fork's exit
    lets go of all the zygote imported, about 2.7 s here against a fresh one's 0.4 s.
    A command with one of NO_VLLM_FLAGS is fresh for the same reason."""
    fresh = fresh or any(a.partition("=")[0] in NO_VLLM_FLAGS for a in args)
    if not fresh and not fresh_reason(env, bool(prefix), " ".join(args)):
        return ForkedRun([KVSCOPE, *args], env, ROOT, stdin)
    return subprocess.Popen(
        [*prefix, KVSCOPE, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )


def finish_in_group(
    proc: KvscopeProcess, timeout: float, stdin: bytes | None = None
) -> tuple[bytes, bytes]:
    """What a `start_kvscope` process wrote, once it exited. One still running after
    `timeout` has its group killed (and subprocess.TimeoutExpired raised); then nothing
    of its group may be left (`assert_group_gone`)."""
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_group_gone(proc.pid)
    return out, err


def run_kvscope(
    *args: str,
    env: dict[str, str],
    timeout: float,
    stdin: bytes | None = None,
    prefix: Sequence[str] = (),
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`start_kvscope`, then `finish_in_group`: the run, its output decoded."""
    proc = start_kvscope(*args, env=env, stdin=stdin is not None, prefix=prefix, fresh=fresh)
    out, err = finish_in_group(proc, timeout, stdin)
    argv = [*prefix, KVSCOPE, *args]
    code = proc.wait()  # it has ended: finish_in_group waited
    return subprocess.CompletedProcess(
        argv, code, out.decode(errors="replace"), err.decode(errors="replace")
    )
