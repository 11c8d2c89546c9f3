"""Recording a session: cheap hand-offs on the engine's threads, one writer thread for the file.

The engine's step thread and the UI's event loop only put what they saw on a queue (about
a microsecond); a writer thread turns it into lines and writes them. It writes whatever
has queued up in one `write` call to an unbuffered file, so every step reaches the kernel
as soon as the writer wakes, normally well before the next step: a `kill -9` loses at most
the step in flight. (A power cut can lose more: that would take an fsync per step.)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.byte_size import in_unit
from engine.clock import Clock, RealClock, VirtualClock
from engine.events import EngineEvent, GenerationRequest, ModelCard, StepSample, UserMessage
from engine.paths import open_private, output_problem, private_dir
from engine.sizes import GIB
from engine.tape.errors import TapeUnwritable
from engine.tape.format import Encoder, Kind, dumps, header
from engine.tape.paths import default_tape_path
from engine.visible_text import well_formed

log = logging.getLogger("kvscope")

DEFAULT_CAP_BYTES = 1 * GIB
# Room kept under the cap for the line that says why recording ended.
_END_RESERVE = 512
# The writer takes at most this many records per write, so one write stays small.
_BATCH = 1024

NoticeCallback = Callable[[str], None]
_STOP = object()


def _well_formed_record(value: Any) -> tuple[Any, int]:
    """An encoded record with every string well_formed(), and how many code points changed:
    the lists, tuples and dicts an Encoder makes, walked."""
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, list | tuple):
        items = [_well_formed_record(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    if isinstance(value, dict):
        pairs = [(_well_formed_record(k), _well_formed_record(v)) for k, v in value.items()]
        return {k: v for (k, _), (v, _) in pairs}, sum(a + b for (_, a), (_, b) in pairs)
    return value, 0


def _cap_size(n: int) -> str:
    """The cap as the notice names it: "1.00 GiB" from a GiB up, "64.0 MiB" below (the
    exact bytes follow it in the notice)."""
    return in_unit(n, "GiB", 2) if n >= GIB else in_unit(n, "MiB", 1)


class TapeRecorder:
    """Writes one session's tape. Every `record_*` method is safe from any thread.

    Args:
        path: the file to write (created with its folders; an existing file is replaced).
            None: a new file under the user's data folder (`default_tape_path()`).
        card: the model card, when the engine is already running.
        cap_bytes: the tape stops (with a notice) before it would grow past this.
        clock: the engine's clock, for the times of records that carry none of their own;
            the default is the real one, which `VllmEngine` stamps its events with.
        on_notice: called once, from the writer thread, with one sentence when recording
            stops early (the cap, a write error). A UI must only post a message from it.

    Raises:
        TapeUnwritable: the file cannot be created.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        card: ModelCard | None = None,
        *,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        clock: Clock | None = None,
        on_notice: NoticeCallback | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else default_tape_path()
        self.cap_bytes = cap_bytes
        self.clock: Clock = clock or RealClock()
        self.on_notice = on_notice
        self.notice: str | None = None  # why recording stopped early, once it has
        self.bytes_written = 0
        self.records = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopped = False  # no more records are taken (closed, cap or error)
        self._closed = False
        self._encoder = Encoder()
        self._said_not_unicode = False  # a record's lone surrogates: said once (_line)
        try:
            private_dir(self.path.parent)
            # Every prompt and reply is on it: 0600, whatever the umask. Unbuffered: each
            # write() is one system call, so what was written is in the kernel, and
            # survives the process being killed.
            fd = open_private(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            self._file = os.fdopen(fd, "wb", buffering=0)
        except OSError as exc:
            raise TapeUnwritable(self.path, output_problem(self.path, exc)) from None
        clock_name = "virtual" if isinstance(self.clock, VirtualClock) else "perf_counter"
        head = header(
            t0=self.clock.now(),
            clock=clock_name,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            writer="kvscope",
        )
        try:
            # The header is written before anything runs: a full disk (or /dev/full) is
            # refused here, in words, not found later as an unexpected OSError.
            self._write(dumps(head) + b"\n")
        except OSError as exc:
            self._file.close()
            raise TapeUnwritable(self.path, output_problem(self.path, exc)) from None
        if card is not None:
            self.record_card(card)
        self._thread = threading.Thread(target=self._run, name="kvscope-tape", daemon=True)
        self._thread.start()
        # A session that ends without closing its engine still gets its last records.
        atexit.register(self.close)

    # -- what the session hands over (any thread) --------------------------------------------
    def _put(self, kind: Kind, value: Any, at: float | None = None) -> None:
        if not self._stopped:
            self._queue.put((kind, value, self.clock.now() if at is None else at))

    def record_card(self, card: ModelCard) -> None:
        self._put("card", card)

    def record_step(self, sample: StepSample) -> None:
        # The step carries its own times; the queue entry's is never used.
        self._put("step", sample, 0.0)

    def record_request(self, request: GenerationRequest) -> None:
        """`stream()` was called with `request` (before the engine accepted it)."""
        self._put("request", request)

    def record_event(self, event: EngineEvent) -> None:
        self._put("event", event)

    def record_failure(self, request_id: str, error: BaseException) -> None:
        """The request's stream raised `error` instead of finishing."""
        self._put("failure", (request_id, error))

    def record_abandoned(self, request_id: str) -> None:
        """The consumer stopped listening to the request before it finished."""
        self._put("abandoned", request_id)

    def record_user_message(
        self,
        text: str,
        *,
        request_ids: tuple[str, ...] | list[str] = (),
        synthetic_tokens: int | None = None,
    ) -> UserMessage:
        """What the user sent, before its requests are streamed; returns the record."""
        message = UserMessage(text, self.clock.now(), tuple(request_ids), synthetic_tokens)
        self._put("message", message, message.time_s)
        return message

    def record_new_chat(self) -> None:
        """The user started a new chat: `--resume` restores only what follows."""
        self._put("chat", None)

    @property
    def recording(self) -> bool:
        return not self._stopped

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and an end line, then close the file. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        self._queue.put(("end", ("closed", ""), self.clock.now()))
        self._queue.put(_STOP)
        self._stopped = True
        self._thread.join(timeout)

    # -- the writer thread -------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a raw write may take only part of it
            n = self._file.write(view)
            if not n:
                raise OSError("the file took no bytes")
            view = view[n:]
        self.bytes_written += len(data)

    def _run(self) -> None:
        ending = False
        while not ending:
            batch = [self._queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines: list[bytes] = []
            for item in batch:
                if item is _STOP:
                    ending = True
                    break
                kind, value, at = item
                if self.notice is not None:
                    continue  # stopped early: drain the queue, write nothing more
                try:
                    lines.append(self._line(self._encoder.encode(kind, value, at)))
                except Exception:
                    # A value the format cannot hold must not end the recording.
                    log.exception("kvscope: a tape record could not be encoded")
            if lines and self.notice is None:
                self._flush(lines)
        with contextlib.suppress(OSError):
            self._file.close()

    def _line(self, record: Any) -> bytes:
        """One record as a line of UTF-8. A lone surrogate (half a UTF-16 pair: a server's
        JSON escape, a pasted byte) has no UTF-8: it is written as U+FFFD, so the record
        is kept, and that is said once, not once a record."""
        try:
            return dumps(record)
        except UnicodeEncodeError:
            fixed, count = _well_formed_record(record)
            line = dumps(fixed)
        if not self._said_not_unicode:
            self._said_not_unicode = True
            s = "" if count == 1 else "s"
            log.warning(
                "kvscope: the tape %s: %d lone surrogate%s (half a UTF-16 pair, no character) "
                "in a record written as U+FFFD; later ones are replaced without a word.",
                self.path,
                count,
                s,
            )
        return line

    def _flush(self, lines: list[bytes]) -> None:
        data = b"\n".join(lines) + b"\n"
        limit = self.cap_bytes - _END_RESERVE
        try:
            if self.bytes_written + len(data) <= limit:
                self._write(data)
                self.records += len(lines)
                return
            # Past the cap: keep the whole lines that still fit, then say why it ends.
            for line in lines:
                raw = line + b"\n"
                if self.bytes_written + len(raw) > limit:
                    break
                self._write(raw)
                self.records += 1
            at = self.clock.now()
            end = self._encoder.encode("end", ("cap", f"{self.cap_bytes} bytes"), at)
            self._write(dumps(end) + b"\n")
            self._stop_early(
                f"Recording stopped: the tape {self.path} reached its size cap of "
                f"{_cap_size(self.cap_bytes)} ({self.cap_bytes:,} bytes). The session goes on; "
                "what follows is not recorded."
            )
        except OSError as exc:
            self._stop_early(
                f"Recording stopped: writing the tape {self.path} failed "
                f"({exc.strerror or exc}) after {self.bytes_written:,} bytes. The session "
                "goes on; what follows is not recorded."
            )

    def _stop_early(self, notice: str) -> None:
        self.notice = notice
        self._stopped = True
        log.warning("kvscope: %s", notice)
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:
                log.exception("kvscope: the tape's notice callback failed")
