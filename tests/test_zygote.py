"""The tests' zygote (tests/kvscope_zygote.py) forks what a fresh process would be: the same
output, exit status, session, folder, environment and signals. Checked against a fresh
`python -c` of the same script; the zygote here imports only `json`, so the check costs no
vLLM import (the forks' plumbing is the same whatever was imported)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from cli_helpers import KvscopeProcess, finish_in_group
from kvscope_zygote import ForkedRun, Zygote

if TYPE_CHECKING:
    from pathlib import Path

SCRIPT = """
import json, os, sys
data = sys.stdin.read()
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "main": __name__,
    "leader": os.getsid(0) == os.getpid() == os.getpgid(0), "said": os.environ.get("SAID"),
    "stdin": data, "fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))[:3],
}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""
SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


@pytest.fixture(scope="module")
def zygote() -> Zygote:
    z = Zygote({**os.environ, "SAID": "zygote"}, preload=("json",))
    assert not z.unsafe, z.unsafe
    return z


def fresh(code: str, *args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, start_new_session=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_a_fork_runs_a_script_as_a_fresh_python_does(zygote: Zygote, tmp_path: Path) -> None:
    env = {**zygote.env, "SAID": "this run"}
    runs: dict[str, KvscopeProcess] = {
        "fresh": fresh(SCRIPT, "3", env=env, cwd=tmp_path),
        "forked": ForkedRun(
            [sys.executable, "-c", SCRIPT, "3"], env, tmp_path, stdin=True, zygote=zygote
        ),
    }
    seen = {}
    for name, proc in runs.items():
        out, err = proc.communicate(b"typed\n", timeout=60)
        seen[name] = (proc.returncode, out, err)
    assert seen["forked"] == seen["fresh"]
    code, out, err = seen["forked"]
    assert code == 3 and err == b"to stderr\n"
    assert b'"said": "this run"' in out and b'"leader": true' in out and b'"typed\\n"' in out


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_a_signal_to_its_group_does_what_it_does_to_a_fresh_one(
    zygote: Zygote, tmp_path: Path, sigint: str
) -> None:
    """Ctrl-C (SIGINT to the group) ends both with KeyboardInterrupt's status, or, where
    the test's process ignores SIGINT (an xdist worker does, and a fresh process keeps
    that across exec), leaves both running; SIGTERM then ends both."""
    env = dict(zygote.env)
    was = signal.signal(
        signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler
    )
    try:
        runs: dict[str, KvscopeProcess] = {
            "fresh": fresh(SLEEPER, env=env, cwd=tmp_path),
            "forked": ForkedRun([sys.executable, "-c", SLEEPER], env, tmp_path, False, zygote),
        }
    finally:
        signal.signal(signal.SIGINT, was)
    for proc in runs.values():
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"
        os.killpg(proc.pid, signal.SIGINT)
    if sigint == "ignored":
        time.sleep(0.5)  # a SIGINT that ended one would have by now; none may
        assert [p.poll() for p in runs.values()] == [None, None]
        for proc in runs.values():
            os.killpg(proc.pid, signal.SIGTERM)
    codes = {}
    for name, proc in runs.items():
        finish_in_group(proc, 30)
        codes[name] = proc.returncode
    want = -signal.SIGINT if sigint == "handled" else -signal.SIGTERM
    assert codes == {"fresh": want, "forked": want}


def test_a_run_past_its_timeout_is_killed_with_its_group(zygote: Zygote, tmp_path: Path) -> None:
    proc = ForkedRun([sys.executable, "-c", SLEEPER], dict(zygote.env), tmp_path, False, zygote)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        finish_in_group(proc, 1.0)
    assert time.monotonic() - start < 30
    assert proc.returncode == -signal.SIGKILL


CYCLE = """
import os
class Cycle:  # garbage only once the interpreter clears this module at its exit
    def __del__(self, write=os.write):
        write(2, b"collected at exit\\n")
cycle = Cycle()
cycle.me = cycle
"""


def test_what_the_zygote_imported_is_collected_at_a_forks_exit_as_at_a_fresh_ones(
    tmp_path: Path,
) -> None:
    # The zygote freezes what its imports made (out of every collection's reach): a fork's
    # exit must collect it again, as a fresh process's exit does, or native bindings say
    # they leaked (nanobind's report on stderr, under triton).
    (tmp_path / "cycle_at_exit.py").write_text(CYCLE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    z = Zygote(env, preload=("cycle_at_exit",))
    assert not z.unsafe, z.unsafe
    code = "import cycle_at_exit"
    runs: dict[str, KvscopeProcess] = {
        "fresh": fresh(code, env=env, cwd=tmp_path),
        "forked": ForkedRun([sys.executable, "-c", code], env, tmp_path, False, z),
    }
    seen = {name: proc.communicate(timeout=60)[1] for name, proc in runs.items()}
    z.end()
    assert seen == {"fresh": b"collected at exit\n", "forked": b"collected at exit\n"}


def test_what_the_imports_set_makes_no_new_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that imported vLLM has in its environment what the import set there; a run
    # from it is still the zygote's, started before: its imports set the same.
    import kvscope_zygote

    monkeypatch.setattr(kvscope_zygote, "_set_by_imports", {"TORCH_X": "1"})
    before = {"HOME": "/h", "KVSCOPE_RUN": "a"}
    assert kvscope_zygote.import_env({**before, "TORCH_X": "1"}) == kvscope_zygote.import_env(
        before
    )
    # Any other value is an environment of its own, as any other variable is.
    assert kvscope_zygote.import_env({**before, "TORCH_X": "2"}) != kvscope_zygote.import_env(
        before
    )
    assert kvscope_zygote.import_env({**before, "OTHER": "1"}) != kvscope_zygote.import_env(before)
