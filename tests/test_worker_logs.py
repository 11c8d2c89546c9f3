"""A vLLM worker process that fails says why on kvscope's screen, not on a stderr under it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import TYPE_CHECKING

from engine.errors import DeviceOutOfMemory, EngineStartFailed
from engine.vllm import worker_logs
from engine.vllm.startup import map_start_error
from engine.vllm.worker_logs import worker_failure, worker_logging

if TYPE_CHECKING:
    from pathlib import Path

VLLM_SAYS = (
    "WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause."
)

WORKER_LOG = """\
2026-12-01 10:00:00,001 INFO vllm.v1.worker: Loading weights
2026-12-01 10:00:01,002 ERROR vllm.v1.executor.multiproc_executor: WorkerProc failed to start.
Traceback (most recent call last):
  File "/x/vllm/v1/executor/multiproc_executor.py", line 950, in worker_main
    worker = WorkerProc(*args, **kwargs)
  File "/x/vllm/v1/worker/gpu_worker.py", line 200, in init_device
    raise ValueError("boom inside")
ValueError: boom inside

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/vllm/v1/worker/gpu_model_runner.py", line 10, in load_model
    torch.empty(n)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 22.05 GiB of which 1.06 GiB is free.
2026-12-01 10:00:01,500 INFO vllm.engine: shutting down
"""


def _start_error(log: Path | None, text: str = VLLM_SAYS) -> object:
    return map_start_error(
        Exception(text),
        model="m",
        max_model_len=None,
        kv_bytes_per_token=None,
        block_size=None,
        kv_cache_memory_bytes=None,
        log_path=log,
    )


def test_the_workers_exception_is_read_back_from_the_engine_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(WORKER_LOG)
    cause = worker_failure(log)
    assert cause is not None and cause.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    # A worker's CUDA OOM is the OOM error, with its numbers, not "see stack trace".
    error = _start_error(log)
    assert isinstance(error, DeviceOutOfMemory), error


def test_a_worker_failure_without_a_known_cause_still_names_the_worker_and_the_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "engine.log"
    log.write_text(WORKER_LOG.replace("torch.OutOfMemoryError: CUDA out of memory", "KeyError: w"))
    error = _start_error(log)
    assert isinstance(error, EngineStartFailed)
    assert error.plain().startswith("The engine could not start: a vLLM worker process failed")
    assert "KeyError: w" in error.plain() and str(log) in error.plain()
    assert "See stack trace" not in error.plain()
    empty = tmp_path / "empty.log"
    empty.write_text("")
    said = _start_error(empty)
    assert isinstance(said, EngineStartFailed)
    assert "said why only on its own stderr" in said.plain()


def test_a_spawned_worker_logs_into_the_engine_log_through_the_config(tmp_path: Path) -> None:
    """A fresh interpreter, as vLLM's spawn makes one, applies the config kvscope hands it
    (vLLM's worker_main calls dictConfig on it) and writes into the engine log, 0600."""
    log = tmp_path / "logs" / "engine.log"
    where = worker_logging(logging.NullHandler(), log)
    worker_logs._routed = None  # this test's process is not kvscope's engine
    assert where is not None and json.loads(where.read_text())["version"] == 1
    assert where.stat().st_mode & 0o777 == 0o600
    script = (
        "import json, logging, logging.config, sys\n"
        f"logging.config.dictConfig(json.load(open({str(where)!r})))\n"
        "logging.getLogger('vllm.worker').error('worker %s failed', 3)\n"
        "print('stderr has nothing', file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr.strip() == "stderr has nothing"
    assert "ERROR vllm.worker: worker 3 failed" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
