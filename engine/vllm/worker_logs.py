"""vLLM's worker processes log where the engine logs, and a worker's failure is told in words.

With tensor or pipeline parallelism vLLM runs its workers in processes of their own and hands
each one its `LoggingConfig`. Started with spawn, a worker sets up logging afresh: vLLM's
default handler writes to stderr, under kvscope's terminal UI, and a worker that fails to
start leaves its cause only there, while the engine says "WorkerProc initialization failed
... See stack trace for root cause". So kvscope gives the workers a logging config whose one
handler comes from `worker_handler` here: the handler kvscope's own process already logs
through (which a forked worker inherits), or the same file opened for appending in a spawned
one. When the engine then fails to start because a worker did, `worker_failure` reads the
worker's exception back out of that file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from engine.paths import open_private, open_private_log, private_dir

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONFIG_NAME = "vllm-worker-logging.json"

_routed: logging.Handler | None = None
"""The handler this process logs vLLM through (set in kvscope's process; inherited by a
forked worker; None in a spawned one, which opens the file itself)."""


def worker_handler(path: str = "") -> logging.Handler:
    """The `logging.config.dictConfig` factory a worker's config names (`"()"`)."""
    if _routed is not None:
        return _routed
    if not path:
        return logging.NullHandler()  # kvscope keeps no log: nor do its workers
    handler = logging.StreamHandler(open_private_log(Path(path)))
    handler.setFormatter(logging.Formatter(_FORMAT))
    return handler


def worker_logging(handler: logging.Handler, log_path: Path | None) -> Path | None:
    """Remember `handler`, write the workers' dictConfig beside the log (0600) and return
    its path for vLLM's `--logging-config.pylogging_config_file`; None when there is no
    folder to write it in (the workers then log as vLLM would)."""
    global _routed
    _routed = handler
    if log_path is None:
        return None
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"kvscope": {"()": f"{__name__}.worker_handler", "path": str(log_path)}},
        "loggers": {"vllm": {"handlers": ["kvscope"], "level": "INFO", "propagate": False}},
    }
    where = log_path.parent / CONFIG_NAME
    try:
        private_dir(where.parent)
        fd = open_private(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(config, f)
    except OSError:
        return None
    return where


WORKER_FAILED = "WorkerProc initialization failed"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?.*)$")
_TAIL_BYTES = 256 * 1024


def worker_failure(log_path: Path | None) -> str | None:
    """The exception a worker process logged last ("torch.OutOfMemoryError: CUDA out of
    memory. Tried to allocate 2.00 GiB ..."), from the end of the engine log; None when
    the log has none."""
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # A worker's traceback follows vLLM's "WorkerProc failed to start." / "hit an
    # exception." line; its last line is the exception itself.
    start = max(tail.rfind("WorkerProc failed"), tail.rfind("WorkerProc hit an exception"))
    if start < 0:
        return None
    found = None
    for line in tail[start:].splitlines()[1:]:
        m = _EXCEPTION_LINE.match(line.strip())
        if m and not line.startswith((" ", "\t")):
            found = m.group(1)
        elif found is not None and re.match(r"^\d{4}-\d\d-\d\d", line):
            break  # the next log record: the traceback is over
    if found is None:
        return None
    return found if len(found) <= 300 else found[:299] + "…"
