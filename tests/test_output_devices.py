"""Outputs onto a device or a FIFO: written in place, never renamed over, never chmodded.

Run as root (the normal case on a GPU box), `--json /dev/full` used to leave /dev/full a
0600 regular file, and `--tape /dev/null` chmodded /dev/null to 0600. The devices here are
made with mknod in a temp folder (the same major/minor as /dev/null and /dev/full), never
the real /dev; without the right to mknod the device tests skip, the FIFO ones still run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import KVSCOPE, ROOT

from bench.sweep_result import SweepConfig, SweepResult
from cli.result_files import ResultFile
from engine.paths import open_private, write_private
from engine.tape import TapeRecorder
from engine.tape.errors import TapeUnwritable
from tui.sweep.files import FileTrouble, export

NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)  # what /dev/null and /dev/full are
SHARED_MODE = 0o666


def _device(folder: Path, name: str, dev: int) -> Path:
    path = folder / name
    try:
        os.mknod(path, stat.S_IFCHR | SHARED_MODE, dev)
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    os.chmod(path, SHARED_MODE)  # mknod's mode is masked by the umask
    return path


def _still_shared_device(path: Path) -> None:
    info = os.stat(path)
    assert stat.S_ISCHR(info.st_mode), f"{path} is no longer a device"
    assert stat.S_IMODE(info.st_mode) == SHARED_MODE, oct(info.st_mode)


@pytest.fixture
def null(tmp_path: Path) -> Path:
    return _device(tmp_path, "null", NULL)


@pytest.fixture
def full(tmp_path: Path) -> Path:
    return _device(tmp_path, "full", FULL)


class Reader:
    """A FIFO's reader, open before the test writes (so a writer finds it), reading on a
    thread until the writer that sent something closes.

    Opened without blocking, in the caller's thread: a probe writer that opens and closes
    to see whether a reader is there would hand that reader an end of file."""

    def __init__(self, path: Path) -> None:
        self.data = b""
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:  # a writer is there, with nothing sent yet
                    chunk = None
                if chunk:
                    self.data += chunk
                elif chunk == b"" and self.data:
                    return  # the writer that sent the data closed
                else:
                    time.sleep(0.005)  # no writer yet (end of file) or nothing yet
        finally:
            os.close(self._fd)

    def join(self) -> bytes:
        self._thread.join(15)
        assert not self._thread.is_alive(), "the reader never finished"
        return self.data


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    os.chmod(path, 0o644)  # mkfifo's mode is masked by the umask
    return path


def test_a_device_is_written_through_not_replaced_nor_chmodded(null: Path) -> None:
    write_private(null, "results")
    _still_shared_device(null)
    os.close(open_private(null, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))  # how a tape opens
    _still_shared_device(null)


def test_a_regular_file_is_still_made_private(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old")
    path.chmod(0o644)
    os.close(open_private(path, os.O_WRONLY | os.O_TRUNC))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_private(path, "new")
    assert (path.read_text(), stat.S_IMODE(path.stat().st_mode)) == ("new", 0o600)


def test_a_fifo_gets_the_text_once_and_stays_a_fifo(fifo: Path) -> None:
    reader = Reader(fifo)
    write_private(fifo, "one export")
    assert reader.join() == b"one export"
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644


def test_a_fifo_nobody_reads_is_said_at_once_not_waited_on(fifo: Path) -> None:
    out = ResultFile("--json", str(fifo), render=str)
    out.check()
    out.write("point 1")
    out.finish()  # would block for good if it waited for a reader
    assert out.problem() is not None
    assert "a FIFO that no process is reading" in str(out.problem())
    assert out.written_to is not None and out.written_to.read_text() == "point 1"
    out.written_to.unlink()
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_results_reach_a_fifo_once_at_the_end_not_once_a_point(fifo: Path) -> None:
    out = ResultFile("--json", str(fifo), render=lambda n: json.dumps({"points": n}))
    out.check()
    reader = Reader(fifo)
    for n in (1, 2, 3):  # a sweep writes after every point
        out.write(n)
    out.finish()
    assert json.loads(reader.join()) == {"points": 3}
    assert (out.problem(), out.written_to) == (None, fifo)


def test_a_full_device_is_one_sentence_and_the_results_are_kept(full: Path) -> None:
    out = ResultFile("--csv", str(full), render=str)
    out.check()
    out.write("prompt_len,ttft\n32,0.1\n")
    out.finish()
    said = out.problem()
    assert said is not None and f"could not write {full} (No space left on device)" in said
    assert out.written_to is not None and out.written_to.read_text().startswith("prompt_len")
    assert str(out.written_to) in said
    out.written_to.unlink()
    _still_shared_device(full)


def test_bench_onto_a_full_device_keeps_it_a_device_and_says_so(full: Path, null: Path) -> None:
    """The issue's own command, on the fake engine: /dev/full stays a device, the reason is
    one line, the table is on stdout, and /dev/null (the CSV) is left as it was."""
    run = subprocess.run(
        [
            KVSCOPE, "bench", "--fake", "--concurrency", "1,2", "--prompt-lens", "32",
            "--output-len", "4", "--num-prompts", "4", "--json", str(full), "--csv", str(null),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    _still_shared_device(full)
    _still_shared_device(null)
    lines = [x for x in run.stderr.splitlines() if f"could not write {full}" in x]
    assert len(lines) == 1 and "No space left on device" in lines[0], run.stderr[-2000:]
    kept = Path(lines[0].rsplit("the results are in ", 1)[1])
    assert json.loads(kept.read_text())["points"], kept
    kept.unlink()


def test_a_tape_onto_a_full_device_is_refused_in_words_before_anything_runs(full: Path) -> None:
    with pytest.raises(TapeUnwritable) as info:
        TapeRecorder(full)
    assert info.value.plain() == f"Cannot record a tape at {full}: No space left on device."
    _still_shared_device(full)


def test_a_tape_onto_a_fifo_nobody_reads_is_refused_not_waited_on(fifo: Path) -> None:
    with pytest.raises(TapeUnwritable) as info:
        TapeRecorder(fifo)  # a blocking open would never return
    assert "a FIFO that no process is reading" in info.value.plain()
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644


def test_the_sweep_screens_export_onto_a_device_keeps_its_name_and_the_device(null: Path) -> None:
    """F7 to /dev/null writes /dev/null, not a new /dev/null.json beside it."""
    result = SweepResult(SweepConfig(prompt_lens=(64,), output_len=4, runs=1, warmup=0))
    said = export(result, "json", str(null), "sweep")
    assert said == f"Wrote 0 points to {null}"
    assert sorted(p.name for p in null.parent.iterdir()) == ["null"]
    _still_shared_device(null)


def test_the_sweep_screens_export_onto_a_fifo_nobody_reads_says_so(fifo: Path) -> None:
    result = SweepResult(SweepConfig(prompt_lens=(64,), output_len=4, runs=1, warmup=0))
    with pytest.raises(FileTrouble, match="a FIFO that no process is reading"):
        export(result, "csv", str(fifo), "sweep")
    assert stat.S_ISFIFO(fifo.stat().st_mode)
