"""HTTP to a vLLM OpenAI-compatible server: the URL, the API key, errors in words, SSE.

Plain httpx, no vLLM: a laptop without vLLM or torch can attach to a GPU server.

Credentials in a URL (`http://alice:secret@host`) are taken out of it when it is parsed
and sent as an Authorization header: the URL kvscope keeps, prints and writes (the card,
the tape, the bench JSON, the screen) never holds them.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import httpx

from engine.errors import (
    AuthRequired,
    BadOption,
    EngineStartFailed,
    RequestRejected,
    ServerUnreachable,
)
from engine.remote.timeouts import DEFAULT_TIMEOUTS, ServerStalled, Timeouts
from engine.visible_text import visible, well_formed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

API_KEY_ENV = ("VLLM_API_KEY", "OPENAI_API_KEY")

# The server's words for a prompt past max_model_len (vllm/renderers/params.py, 0.32).
_CONTEXT = re.compile(
    r"maximum context length is (\d+) tokens.*?contains (at least )?(\d+) input tokens", re.S
)
# Older wording (and the in-process engine's): "... maximum context length is N tokens.
# However, you requested M tokens ..." / "... your request has M input tokens".
_CONTEXT_OLD = re.compile(r"maximum context length is (\d+) tokens.*?(\d+) (?:input )?tokens", re.S)
# A prompt of exactly max_model_len tokens leaves no room for one output token.
_NO_ROOM = re.compile(r"max_tokens must be at least 1, got 0")


def resolve_api_key(api_key: str | None) -> str | None:
    """The key given, else VLLM_API_KEY, else OPENAI_API_KEY, else none."""
    if api_key:
        return api_key
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class ServerUrl:
    """A server's root URL with no credentials in it, and the header they became."""

    root: str
    """scheme://host[:port][/path]: no user, no password, no trailing /v1."""
    authorization: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.root


# `javascript:alert(1)`, `mailto:x`: a scheme with no `//`, which is no host:port.
_OTHER_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!\d+(?:/|$))")


def _refuse(reason: str) -> BadOption:
    return BadOption("--url", reason)


def parse_server_url(text: str) -> ServerUrl:
    """`host:8000`, `http://host:8000/`, `http://host:8000/v1` all mean the server's root;
    `http://user:password@host` also sends those as HTTP Basic auth. Raises BadOption
    with the reason for anything that is not an http(s) address of a host."""
    url = text.strip()
    if not url:
        raise _refuse("it is empty; give the server's address, e.g. http://127.0.0.1:8000")
    if "://" not in url:
        if _OTHER_SCHEME.match(url):
            raise _refuse(f"{safe_url(url)!r} is not an http:// or https:// address")
        url = "http://" + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        if "out of range" in str(exc):
            given = urlsplit(url).netloc.rpartition(":")[2]
            raise _refuse(f"port {given} is not a port number (1 to 65535)") from None
        raise _refuse(f"{safe_url(url)!r} is not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse(f"{scheme}:// is not http:// or https://")
    host = parts.hostname
    if not host:
        raise _refuse(f"{safe_url(url)!r} names no host")
    if port == 0:
        raise _refuse("port 0 is not a port a server listens on (1 to 65535)")
    shown_host = f"[{host}]" if ":" in host else host
    netloc = shown_host + (f":{port}" if port is not None else "")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    root = f"{scheme}://{netloc}{path}"
    try:
        httpx.URL(root)
    except httpx.InvalidURL as exc:
        raise _refuse(f"{root!r} is not a URL ({exc})") from None
    authorization = None
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    return ServerUrl(root, authorization)


def safe_url(url: str) -> str:
    """`url` with any user and password in it replaced by `***`, for a message."""
    return re.sub(r"(?<=://)[^/@?#]*@", "***@", url)


def normalize_url(url: str) -> str:
    """The server's root for `url` (see `parse_server_url`), credentials left out."""
    return parse_server_url(url).root


def url_host(url: str) -> str:
    return urlsplit(url).hostname or "127.0.0.1"


def describe(exc: BaseException) -> str:
    """A short reason for a transport error: 'connection refused', 'timed out', ..."""
    text = str(exc).strip()
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if "name or service not known" in low or "nodename nor servname" in low:
        return "unknown host name"
    if "certificate" in low or "ssl" in low:
        return f"TLS: {text[:160]}"
    return text[:200] or type(exc).__name__


class ServerAnswer(Exception):
    """An HTTP error answer that is not about auth; the caller says what it means.

    `words` is the whole of it for a sentence: `HTTP 404: Not Found`, `HTTP 302, a
    redirect to ...`, `HTTP 500 with no message`."""

    def __init__(self, status: int, message: str, location: str | None = None) -> None:
        super().__init__(status, message, location)
        self.status = status
        self.message = message
        self.location = location

    @property
    def words(self) -> str:
        return answer_words(self.status, self.message, self.location)

    def __str__(self) -> str:
        return self.words


def error_message(body: bytes | str) -> str:
    """The human part of a vLLM (or proxy) error body, its control characters made
    visible and its lone surrogates (a JSON escape of half a UTF-16 pair) U+FFFD: it is
    printed and written to tapes, and a server chooses it."""
    return visible(well_formed(_error_message(body))[0])


def _error_message(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(err.get(key), str):
                    return str(err[key])
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return str(data["message"])
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return text.strip()[:500]


@dataclass(frozen=True)
class TooLong:
    """A refusal for length: the numbers from the server's message."""

    prompt_tokens: int | None  # None when the server gave only a lower bound
    lower_bound: int | None
    max_model_len: int | None


def parse_too_long(message: str) -> TooLong | None:
    """Read the server's 'prompt too long' refusal, if that is what `message` is."""
    m = _CONTEXT.search(message)
    if m:
        limit, at_least, count = int(m.group(1)), bool(m.group(2)), int(m.group(3))
        if at_least:
            return TooLong(None, count, limit)
        return TooLong(count, count, limit)
    if _NO_ROOM.search(message):
        return TooLong(None, None, None)
    m = _CONTEXT_OLD.search(message)
    if m:
        return TooLong(int(m.group(2)), int(m.group(2)), int(m.group(1)))
    return None


def auth_headers(api_key: str | None, authorization: str | None = None) -> dict[str, str]:
    """The Authorization header: the URL's credentials, else the API key, else none."""
    if authorization:
        return {"Authorization": authorization}
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_auth(status: int, url: str, key_sent: bool) -> None:
    if status in (401, 403):
        raise AuthRequired(url, status, key_sent=key_sent)


def answer_words(status: int, message: str, location: str | None = None) -> str:
    """`HTTP 404: Not Found`, and never `HTTP 302: .`: a redirect says where it points, an
    empty message says it was empty."""
    message = message.strip()
    if 300 <= status < 400:
        where = f" to {safe_url(location)}" if location else ""
        return f"HTTP {status}, a redirect{where} that kvscope does not follow here"
    return f"HTTP {status}: {message}" if message else f"HTTP {status} with no message"


def transport_failure(url: str, exc: httpx.TransportError, timeouts: Timeouts) -> ServerUnreachable:
    """The typed error for a request that got no answer; a redirect's target that did not
    answer is named, with the URL that sent kvscope there."""
    if isinstance(exc, httpx.ConnectTimeout):
        return ServerStalled(url, "connect", timeouts.connect_s)
    if isinstance(exc, httpx.TimeoutException):
        return ServerStalled(url, "first byte", timeouts.first_byte_s)
    detail = describe(exc)
    try:
        target = str(exc.request.url)
    except RuntimeError:  # no request attached to the error
        target = ""
    if target and not target.startswith(url):
        detail += f" at {safe_url(target)}, where {url} redirected"
    return ServerUnreachable(url, detail)


def _root_of(url: str) -> str:
    """scheme://host:port of an absolute URL, as `parse_server_url` writes a root."""
    try:
        return parse_server_url(url).root.rsplit("/metrics", 1)[0]
    except BadOption:
        return url


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# A prompt kvscope builds is at most 10M tokens (prompts.py); /tokenize answers no more.
MAX_TOKEN_IDS = 16 * 1024**2


# A /tokenize answer of the longest prompt kvscope builds is about 80 MB; /metrics and the
# model list are KBs. Past this an answer is not read on (nor held in memory).
MAX_ANSWER_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class Answer:
    """A server's whole answer to one blocking call."""

    status_code: int
    location: str | None
    content: bytes


class ServerClient:
    """Blocking calls to the server (model list, tokenize, /metrics); one per thread."""

    def __init__(
        self,
        url: str | ServerUrl,
        api_key: str | None = None,
        *,
        verify: bool | str = True,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        timeout: httpx.Timeout | None = None,
    ) -> None:
        where = url if isinstance(url, ServerUrl) else parse_server_url(url)
        self.url = where.root
        self.api_key = api_key
        self.timeouts = timeouts
        self._http = httpx.Client(
            base_url=self.url,
            headers=auth_headers(api_key, where.authorization),
            verify=verify,
            timeout=timeout or timeouts.control(),
            follow_redirects=True,
        )
        self._key_sent = bool(api_key or where.authorization)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: Any = None) -> Answer:
        """One call, its body read up to MAX_ANSWER_BYTES; transport failures become
        ServerUnreachable, 401/403 AuthRequired, a body past the cap RequestRejected."""
        request = self._http.build_request(method, path, json=body)
        try:
            response = self._http.send(request, stream=True)
            try:
                check_auth(response.status_code, self.url, self._key_sent)
                content = bytearray()
                for chunk in response.iter_bytes():
                    content += chunk
                    if len(content) > MAX_ANSWER_BYTES:
                        raise RequestRejected(
                            path,
                            f"{self.url}{path} answered more than {MAX_ANSWER_BYTES:,} bytes, "
                            "far more than any answer of a vLLM server",
                        )
            finally:
                response.close()
        except httpx.TransportError as exc:
            # An absolute `path` (a fleet's charted replica's /metrics) is another server:
            # the failure is its own, not this one's, and no redirect took kvscope there.
            asked = _root_of(path) if "://" in path else self.url
            raise transport_failure(asked, exc, self.timeouts) from exc
        except httpx.TooManyRedirects as exc:
            raise ServerUnreachable(self.url, f"too many redirects: {exc}") from exc
        return Answer(response.status_code, response.headers.get("location"), bytes(content))

    @staticmethod
    def _answer(response: Answer) -> ServerAnswer:
        return ServerAnswer(
            response.status_code, error_message(response.content), response.location
        )

    def json(self, method: str, path: str, body: Any = None) -> Any:
        response = self.request(method, path, body)
        if response.status_code >= 300:
            raise self._answer(response)
        try:
            return json.loads(response.content)
        except (ValueError, RecursionError) as exc:
            raise EngineStartFailed(
                f"{self.url}{path} did not answer JSON; is this a vLLM server?"
            ) from exc

    def text(self, path: str) -> str:
        response = self.request("GET", path)
        if response.status_code >= 300:
            raise self._answer(response)
        return response.content.decode("utf-8", "replace")

    # -- the calls kvscope makes --------------------------------------------------------------
    def models(self) -> list[dict[str, Any]]:
        data = self.json("GET", "/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise EngineStartFailed(f"{self.url}/v1/models did not list models")
        return [m for m in models if isinstance(m, dict)]

    def tokenize_messages(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        data = self.json(
            "POST",
            "/tokenize",
            {"model": model, "messages": messages, "add_generation_prompt": True},
        )
        return self._token_ids(data)

    def tokenize_text(self, model: str, text: str) -> list[int]:
        data = self.json(
            "POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        return self._token_ids(data)

    def _token_ids(self, data: Any) -> list[int]:
        """`tokens` of a /tokenize answer, checked: a list of whole numbers, no more than
        any prompt kvscope sends."""
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise RequestRejected(
                "tokenize",
                f"{self.url}/tokenize answered tokens {_short(tokens)}, where a list of token "
                "IDs belongs; is this a vLLM server?",
            )
        if len(tokens) > MAX_TOKEN_IDS:
            raise RequestRejected(
                "tokenize",
                f"{self.url}/tokenize answered {len(tokens):,} token IDs, more than the "
                f"{MAX_TOKEN_IDS:,} any prompt kvscope sends",
            )
        for t in tokens:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise RequestRejected(
                    "tokenize",
                    f"{self.url}/tokenize answered {_short(t)} among its token IDs, which are "
                    "whole numbers from 0",
                )
        return tokens


# One event's bytes, at most. vLLM's largest is a chat's first chunk, which carries the
# prompt's token IDs: about 7 bytes a token, so 64 MiB holds a 9M-token prompt.
MAX_EVENT_BYTES = 64 * 1024**2


class EventTooLarge(ValueError):
    """An SSE event (or a line of one) past MAX_EVENT_BYTES: no vLLM sends one."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        return f"an event of over {self.limit:,} bytes ({self.size:,} so far) in the stream"


# json.loads's own scanner (JSONDecoder sets it in __init__; typeshed leaves it out).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_value(text: str) -> Any:
    """`json.loads(text)` for one SSE payload, by the very scanner it uses, without its two
    regular-expression passes for white space (a µs a token at 256 streams). Anything
    but one bare JSON value (white space around it, or not JSON) goes to json.loads,
    which answers it, or raises its own error."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class SseDecoder:
    """Splits a server-sent-events byte stream into its `data:` payloads.

    Events end with a blank line; a read can hold several events or part of one, so the
    unfinished tail waits for the next read. Each byte is looked at a bounded number of
    times, however many reads an event spans (linear, not quadratic), and an event past
    `max_event_bytes` raises EventTooLarge instead of growing without end.
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for an event's end
        self._cr = False  # the last read ended in \r, maybe half of \r\n

    def feed(self, data: bytes) -> Iterable[str]:
        """The payloads of the events `data` completes, one at a time: an event past the
        limit raises only once those before it were taken."""
        if (
            data.endswith(b"\n\n")
            and not self._buf
            and not self._cr
            and len(data) <= self.max_event_bytes
            and b"\r" not in data
        ):
            # The read of nearly every token: whole one-line `data: ` events and nothing
            # left over. A list, not a generator (a token's generator cost a µs at 256
            # streams); anything else is handed to the general scan below, from scratch.
            payloads = []
            for event in data[:-2].split(b"\n\n"):
                if not event.startswith(b"data: ") or b"\n" in event:
                    return self._events(data)
                payloads.append(event[6:].decode("utf-8", "replace"))
            return payloads
        return self._events(data)

    def _events(self, data: bytes) -> Iterator[str]:
        if not self._buf and not self._cr and b"\r" not in data:
            # The common read: nothing left over, no CR. Splitting at the blank lines finds
            # the very events the scan below would, and the tail waits for the next read.
            *events, tail = data.split(b"\n\n")
            self._buf += tail
            self._scanned = len(tail)
            for event in events:
                if event.startswith(b"data: ") and b"\n" not in event:
                    if len(event) > self.max_event_bytes:
                        raise EventTooLarge(len(event), self.max_event_bytes)
                    yield event[6:].decode("utf-8", "replace")
                    continue
                text = self._data(event)
                if text is not None:
                    yield text
            if len(self._buf) > self.max_event_bytes:
                raise EventTooLarge(len(self._buf), self.max_event_bytes)
            return
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if data.endswith(b"\r"):
            data, self._cr = data[:-1], True
        self._buf += data.replace(b"\r\n", b"\n")
        start = 0
        try:
            while True:
                end = self._buf.find(b"\n\n", max(start, self._scanned - 1))
                if end < 0:
                    break
                event = bytes(self._buf[start:end])
                start = end + 2
                text = self._data(event)
                if text is not None:
                    yield text
        finally:
            if start:
                del self._buf[:start]
            self._scanned = len(self._buf)
        if len(self._buf) > self.max_event_bytes:
            raise EventTooLarge(len(self._buf), self.max_event_bytes)

    def _data(self, event: bytes) -> str | None:
        if len(event) > self.max_event_bytes:
            raise EventTooLarge(len(event), self.max_event_bytes)
        lines = [
            line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        ]
        if not lines:
            return None
        return b"\n".join(lines).decode("utf-8", "replace")
