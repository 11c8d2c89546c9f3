"""The tests' zygote: one Python that has imported vLLM, and forks a `kvscope` run for each
request (tests/kvscope_zygote.py is its client).

Why: about 25 tests run `kvscope` as a user would, in a process of its own, and each such
process spends about 9 s of CPU importing vLLM, torch and transformers before it reads its
flags, on a 2-core machine the whole suite shares. A fork of a process that has done it
once starts where those imports end; the rest (argv, the engine, the exit) is the command's
own code in a process of its own.

    python tests/zygote_server.py SOCKET [MODULE,...]

It prints one line on stdout: `ready THREADS ENV_JSON` (the environment variables its
imports set, which a fork must keep as a fresh process would), or `unsafe REASON` when it
must not fork (a thread started by an import would be missing from every fork). Then it
answers on the Unix socket: a client sends one JSON request (argv, env, cwd) with its three
standard streams as SCM_RIGHTS file descriptors; the zygote forks, answers `pid N`, and
`exit STATUS` (os.waitpid's status) when that process has ended.

The fork starts a session of its own (so a test's killpg reaches it and all it starts),
puts the streams on 0-2, takes the request's environment and folder, and returns from
`serve` to run `cli.main.main()` as the `kvscope` script does: the interpreter's own exit
(atexit handlers, non-daemon threads joined) ends it, as it ends a fresh process.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import types
from dataclasses import dataclass

# What `kvscope generate` imports from vLLM and its stack before it reads a flag (and what
# its engine imports), found with `python -X importtime`: about 9 s of CPU on a 2-core
# EPYC. None of kvscope's own modules: they read its environment when imported.
PRELOAD = (
    "vllm",  # first: where it cannot be imported (a test hides it), that is said at once
    "torch",
    "transformers",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.executor.abstract",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.cpu_worker",
)
RESET_SIGNALS = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
)  # fmt: skip
"""The signals a fork takes from the request: Python itself ignores SIGPIPE and SIGXFSZ
at start-up, in a fresh process as in the zygote."""
MAX_FDS = 3
REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Request:
    argv: list[str]  # [kvscope, ARGS...] or [python, "-c", CODE, ARGS...]
    env: dict[str, str]
    cwd: str
    code: str | None
    ignored: frozenset[int]  # the signals the requester ignores (see `become`)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def receive(conn: socket.socket) -> tuple[Request, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(
        REQUEST_BYTES, socket.CMSG_SPACE(MAX_FDS * fds.itemsize)
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    raw = json.loads(data)
    argv = [str(a) for a in raw["argv"]]
    code = argv[2] if argv[1:2] == ["-c"] else None
    ignored = frozenset(int(x) for x in raw.get("ignored", []))
    return Request(argv, dict(raw["env"]), str(raw["cwd"]), code, ignored), list(fds)


def become(request: Request, fds: list[int], keep_closed: list[int]) -> None:
    """In the fork: the process `kvscope ARGV` would be, from its first line of code."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in {*fds, *keep_closed}:
        if fd > 2:
            os.close(fd)
    # As a fresh Python would start from the requester: a signal it ignores stays ignored
    # across exec (an xdist worker ignores SIGINT, so a fresh Python there never raises
    # KeyboardInterrupt), any other is the default, SIGINT Python's KeyboardInterrupt.
    for sig in RESET_SIGNALS:
        if sig in request.ignored:
            signal.signal(sig, signal.SIG_IGN)
        elif sig == signal.SIGINT:
            signal.signal(sig, signal.default_int_handler)
        else:
            signal.signal(sig, signal.SIG_DFL)
    # The interpreter's exit collects what the zygote froze, as a fresh process's exit
    # collects what its imports made: frozen, triton's bindings stay uncollected, and
    # nanobind prints a leak report on stderr. Registered before the command's own
    # handlers, so it runs after them (atexit runs the last registered first).
    atexit.register(gc.unfreeze)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    if request.code is not None:  # `python -c CODE ARGS`
        sys.argv = ["-c", *request.argv[3:]]
        sys.path[0] = ""
    else:  # a console script's first path entry is its own folder, not this file's
        sys.argv = list(request.argv)
        sys.path[0] = os.path.dirname(request.argv[0])


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> Request | None:
    """Answer requests until stdin closes; returns only in a fork, with the request it
    then runs."""
    start_env = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    # A Python thread would be missing from every fork. The native ones these imports
    # start are OpenBLAS's thread servers (numpy's and OpenCV's copies, seen with gdb),
    # which OpenBLAS itself stops before a fork and starts again after it (pthread_atfork);
    # no OpenMP pool exists yet: nothing here has run a parallel region.
    if threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate())
        print(f"unsafe Python threads after importing {', '.join(preload)}: {names}", flush=True)
        return None
    # What the imports made is frozen, out of every collection's reach: else a fork's
    # collections walk all of it, and each object a walk touches has its page copied. A
    # small `kvscope generate` forked took 7.3 s, 6.1 s with this (a fresh one 15.5 s).
    gc.collect()
    gc.freeze()
    n = threads()
    set_by_imports = {k: v for k, v in os.environ.items() if start_env.get(k) != v}
    unset_by_imports = sorted(k for k in start_env if k not in os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(f"ready {n} {json.dumps({'set': set_by_imports, 'unset': unset_by_imports})}", flush=True)
    waiting: dict[int, socket.socket] = {}  # pid -> the client told when it ends
    closing = False  # stdin closed (the worker ends it, or is gone): leave once none runs
    while not closing or waiting:
        watched = [] if closing else [listener, sys.stdin]
        ready, _, _ = select.select(watched, [], [], 0.05)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            closing = True
            listener.close()
            continue
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = receive(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                others = [listener.fileno(), conn.fileno(), *(c.fileno() for c in waiting.values())]
                become(request, fds, others)
                return request
            for fd in fds:
                os.close(fd)
            conn.sendall(f"pid {pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with contextlib.suppress(OSError):  # the test may have given up on it
                conn.sendall(f"exit {status}\n".encode())
            conn.close()
    return None


if __name__ == "__main__":
    # An optional second argument, modules to import instead of PRELOAD's (comma-separated):
    # tests/test_zygote.py checks the forks' plumbing without vLLM's seconds of imports.
    run = serve(
        sys.argv[1], *([tuple(filter(None, sys.argv[2].split(",")))] if sys.argv[2:] else [])
    )
    if run is not None and run.code is not None:
        main_module = types.ModuleType("__main__")
        sys.modules["__main__"] = main_module
        exec(compile(run.code, "<string>", "exec"), main_module.__dict__)
    elif run is not None:
        from cli.main import main

        sys.exit(main())
