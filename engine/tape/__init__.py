"""Session tapes: every step and token of a session in an append-only file, and reading it back.

- `TapeRecorder` writes a tape from a writer thread; `RecordingEngine` wraps any Engine
  so that everything crossing it is recorded.
- `read_tape` reads one back as a `Tape`; `engine.replay.ReplayEngine` plays it.
- The format (JSON lines, a versioned header first) is described in `format.py`.
"""

from __future__ import annotations

from engine.tape.errors import (
    NotATape,
    RecordedError,
    RecordingCutOff,
    ReplayOnly,
    ReplayRewound,
    TapeCorrupt,
    TapeEmpty,
    TapeError,
    TapeHasNoSession,
    TapeNotFound,
    TapeTooNew,
    TapeUnwritable,
    TornLastLine,
)
from engine.tape.format import FORMAT_VERSION
from engine.tape.paths import default_tape_path, latest_tape, tapes_dir
from engine.tape.reader import RecordedRequest, Tape, TapeEntry, Turn, read_tape
from engine.tape.recorder import DEFAULT_CAP_BYTES, TapeRecorder
from engine.tape.recording import RecordingEngine, record

__all__ = [
    "DEFAULT_CAP_BYTES",
    "FORMAT_VERSION",
    "NotATape",
    "RecordedError",
    "RecordedRequest",
    "RecordingCutOff",
    "RecordingEngine",
    "ReplayOnly",
    "ReplayRewound",
    "Tape",
    "TapeCorrupt",
    "TapeEmpty",
    "TapeEntry",
    "TapeError",
    "TapeHasNoSession",
    "TapeNotFound",
    "TapeRecorder",
    "TapeTooNew",
    "TapeUnwritable",
    "TornLastLine",
    "Turn",
    "default_tape_path",
    "latest_tape",
    "read_tape",
    "record",
    "tapes_dir",
]
