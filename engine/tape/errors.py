"""What can go wrong with a tape, each in one plain sentence with the numbers that explain it.

Reading a tape either gives a `Tape` or raises one of these; a torn last line is not an
error but a `TornLastLine` warning kept on the tape, because a crash that cut the last
write must not cost the user everything before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import KvscopeError

if TYPE_CHECKING:
    from pathlib import Path


class TapeError(KvscopeError):
    """Base of every tape problem; `path` is the file it is about."""

    def __init__(self, path: str | Path, *args: object) -> None:
        super().__init__(str(path), *args)
        self.path = str(path)


class TapeNotFound(TapeError):
    def plain(self) -> str:
        return f"No tape at {self.path}: there is no such file."


class TapeEmpty(TapeError):
    def plain(self) -> str:
        return (
            f"The tape {self.path} is empty (0 bytes): the recording never wrote its "
            "header, so there is nothing to replay."
        )


class NotATape(TapeError):
    def __init__(self, path: str | Path, detail: str) -> None:
        super().__init__(path, detail)
        self.detail = detail

    def plain(self) -> str:
        return f"{self.path} is not a kvscope tape: {self.detail}."


class TapeHasNoSession(TapeError):
    """A valid tape whose engine never became ready: no model card, nothing to show."""

    def plain(self) -> str:
        return (
            f"The tape {self.path} holds no session: its engine never became ready, so it "
            "has no model card and no steps to replay."
        )


class TapeTooNew(TapeError):
    def __init__(self, path: str | Path, version: int, supported: int) -> None:
        super().__init__(path, version, supported)
        self.version = version
        self.supported = supported

    def plain(self) -> str:
        return (
            f"The tape {self.path} has format version {self.version}, but this kvscope "
            f"reads versions up to {self.supported}: upgrade kvscope to replay it."
        )


class TapeCorrupt(TapeError):
    """A line that is not the last one cannot be read: not a crash, but a damaged file."""

    def __init__(self, path: str | Path, line: int, detail: str) -> None:
        super().__init__(path, line, detail)
        self.line = line
        self.detail = detail

    def plain(self) -> str:
        return (
            f"The tape {self.path} is damaged at line {self.line:,} ({self.detail}); only "
            "a last line cut by a crash can be skipped."
        )


class TapeUnwritable(TapeError):
    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(path, reason)
        self.reason = reason

    def plain(self) -> str:
        return f"Cannot record a tape at {self.path}: {self.reason}."


class TornLastLine(TapeError):
    """A warning, not raised: the last line was cut mid-write (a crash or kill -9)."""

    def __init__(self, path: str | Path, line: int, size: int, steps: int) -> None:
        super().__init__(path, line, size, steps)
        self.line = line
        self.size = size
        self.steps = steps

    def plain(self) -> str:
        return (
            f"The tape {self.path} ends with a line cut mid-write (line {self.line:,}, "
            f"{self.size:,} bytes), as a crash leaves it: that line was skipped, and the "
            f"tape reads as far as its last whole line ({self.steps:,} steps)."
        )


class ReplayOnly(KvscopeError):
    """A replay plays its tape; it has no model to take new requests with."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def plain(self) -> str:
        return (
            f"A replay cannot {self.what}: it plays a recorded tape and loads no model. "
            "Use --resume to go on with the conversation on a live engine."
        )


class ReplayRewound(KvscopeError):
    """Ends the streams that were open when a replay was moved back to an earlier step."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step

    def plain(self) -> str:
        return f"The replay moved back to step {self.step:,}; this reply plays again from there."


class RecordingCutOff(KvscopeError):
    """Ends a replayed stream the tape leaves open: the recording stopped mid-reply."""

    def __init__(self, request_id: str, tokens: int) -> None:
        super().__init__(request_id, tokens)
        self.request_id = request_id
        self.tokens = tokens

    def plain(self) -> str:
        return (
            f"Interrupted: the recording stops here, mid-reply, after {self.tokens:,} "
            "tokens (the session was cut off, by a crash or a kill)."
        )


class RecordedError(KvscopeError):
    """An error a recorded session met, rebuilt as its words when its type cannot be."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(kind, text)
        self.kind = kind
        self.text = text

    def plain(self) -> str:
        return self.text
