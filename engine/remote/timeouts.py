"""How long kvscope waits on a server: to connect, for a reply to begin, between chunks.

A server that is stopped (SIGSTOP), wedged or behind a dead proxy answers nothing and
closes nothing; without these a request would wait for ever. Each wait has its own
limit, because each means something else: no connection is a wrong address or a dead
host, no first byte is a queue or a long prefill, no next chunk is a stuck decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.errors import ServerUnreachable

if TYPE_CHECKING:
    import asyncio
    from types import TracebackType

    import httpx

Wait = Literal["connect", "first byte", "between chunks"]

# A day: past it a limit is no limit, and a typo (a missing comma) rather than a wish.
MAX_TIMEOUT_S = 86_400.0
SCRAPE_READ_S = 5.0  # a /metrics scrape waits no longer, whatever --timeout says


def _seconds(value: float) -> str:
    return f"{value:g} s"


@dataclass(frozen=True)
class Timeouts:
    """The three limits, in seconds."""

    connect_s: float = 5.0
    first_byte_s: float = 60.0
    """From sending a request to the first byte of its answer's body: for a streamed
    reply that is the first token, so it covers the server's queue and the prefill."""
    between_chunks_s: float = 30.0

    def flag(self) -> str:
        """As `--timeout` takes it: CONNECT,FIRST_BYTE,BETWEEN_CHUNKS."""
        return f"{self.connect_s:g},{self.first_byte_s:g},{self.between_chunks_s:g}"

    @classmethod
    def parse(cls, text: str) -> Timeouts:
        """`S` (every limit S seconds) or `CONNECT,FIRST_BYTE,BETWEEN_CHUNKS`; raises
        ValueError with the sentence to show."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (1, 3):
            raise ValueError(
                f"{text!r} is not one number or three (CONNECT,FIRST_BYTE,BETWEEN_CHUNKS seconds)"
            )
        values: list[float] = []
        for part in parts:
            try:
                value = float(part)
            except ValueError:
                raise ValueError(f"{part!r} is not a number of seconds") from None
            if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_S:
                raise ValueError(
                    f"{part} is not a number of seconds above 0 and at most {MAX_TIMEOUT_S:,.0f}"
                )
            values.append(value)
        if len(values) == 1:
            values *= 3
        return cls(values[0], values[1], values[2])

    def control(self) -> httpx.Timeout:
        """For calls answered at once (model list, /tokenize, /metrics at attach)."""
        import httpx  # here, not above: --help reads this module and must answer at once

        return httpx.Timeout(
            connect=self.connect_s,
            read=self.first_byte_s,
            write=self.first_byte_s,
            pool=self.first_byte_s,
        )

    def scrape(self) -> httpx.Timeout:
        import httpx

        read = min(self.first_byte_s, SCRAPE_READ_S)
        return httpx.Timeout(connect=min(self.connect_s, read), read=read, write=read, pool=read)

    def streaming(self) -> httpx.Timeout:
        """For streamed replies: reads are timed by the caller (first byte, then between
        chunks), so httpx's own read limit is off."""
        import httpx

        return httpx.Timeout(
            connect=self.connect_s, read=None, write=self.first_byte_s, pool=self.first_byte_s
        )

    def limit(self, wait: Wait) -> float:
        if wait == "connect":
            return self.connect_s
        if wait == "first byte":
            return self.first_byte_s
        return self.between_chunks_s


DEFAULT_TIMEOUTS = Timeouts()


class ServerStalled(ServerUnreachable):
    """A server that stopped answering: one of the three limits ran out.

    A kind of ServerUnreachable, so that every place that copes with a server gone copes
    with this one too; its sentence names the limit and how long it was.
    """

    def __init__(self, url: str, wait: Wait, after_s: float, tokens_received: int = 0) -> None:
        super().__init__(url, f"no answer within {_seconds(after_s)}")
        self.args = (url, wait, after_s, tokens_received)
        self.wait = wait
        self.after_s = after_s
        self.tokens_received = tokens_received

    def plain(self) -> str:
        limit = f"the {self.wait.replace(' ', '-')} timeout; --timeout sets it"
        waited = _seconds(self.after_s)
        if self.wait == "connect":
            return (
                f"No connection to {self.url} within {waited} ({limit}). Check that the "
                "server is running and the address is right, then retry."
            )
        if self.wait == "first byte":
            return (
                f"The server at {self.url} sent nothing for {waited} after the request "
                f"({limit}): it may be stopped, stuck or overloaded. The next request tries "
                "again."
            )
        tokens = f"{self.tokens_received:,} token" + ("" if self.tokens_received == 1 else "s")
        return (
            f"The server at {self.url} sent nothing for {waited} after {tokens} ({limit}). "
            "The reply so far is kept; the next request tries again."
        )


class Watchdog:
    """`async with Watchdog(s)`: the block is cancelled once `s` seconds pass, and
    TimeoutError is raised instead; `reschedule(s)` moves the limit to `s` from now.

    asyncio.timeout() does this from Python 3.11; kvscope runs on 3.10 too. A cancel from
    outside (Esc aborting the reply) stays a CancelledError.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # on the loop's clock

    async def __aenter__(self) -> Watchdog:
        import asyncio  # here: the CLI's parsers import this module and need no asyncio

        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self.reschedule(self.seconds)
        return self

    def reschedule(self, seconds: float) -> None:
        """Move the limit to `seconds` from now. Called for every chunk of a stream, so it
        only writes the new deadline: the timer, when it fires early, sets itself again for
        the rest (a timer cancelled and made anew per chunk was a sixth of the IO thread's
        CPU at 256 streams)."""
        loop = self._loop
        assert loop is not None, "reschedule inside `async with`"
        deadline = loop.time() + seconds
        earlier = deadline < self._deadline
        self._deadline = deadline
        if self._handle is None or earlier:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        loop = self._loop
        assert loop is not None
        if loop.time() < self._deadline:  # moved on since this timer was set
            self._handle = loop.call_at(self._deadline, self._expire)
            return
        self._handle = None
        if self._task is not None and not self._task.done():
            self.expired = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        if self._handle is not None:
            self._handle.cancel()
        if self.expired and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
