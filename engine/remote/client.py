"""HTTP to a vLLM OpenAI-compatible server: the URL, the API key, errors in words, SSE.

Plain httpx, no vLLM: a laptop without vLLM or torch can attach to a GPU server.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from engine.errors import AuthRequired, EngineStartFailed, ServerUnreachable

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


def normalize_url(url: str) -> str:
    """`host:8000`, `http://host:8000/`, `http://host:8000/v1` all mean the server's root."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


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
    """An HTTP error answer that is not about auth; the caller says what it means."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}"


def error_message(body: bytes | str) -> str:
    """The human part of a vLLM (or proxy) error body."""
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


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_auth(status: int, url: str, api_key: str | None) -> None:
    if status in (401, 403):
        raise AuthRequired(url, status, key_sent=bool(api_key))


class ServerClient:
    """Blocking calls to the server (model list, tokenize, /metrics); one per thread."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        verify: bool | str = True,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = normalize_url(url)
        self.api_key = api_key
        self._http = httpx.Client(
            base_url=self.url,
            headers=auth_headers(api_key),
            verify=verify,
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=True,
        )

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """One call; transport failures become ServerUnreachable, 401/403 AuthRequired."""
        try:
            if body is None:
                response = self._http.request(method, path)
            else:
                response = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.url, describe(exc)) from exc
        check_auth(response.status_code, self.url, self.api_key)
        return response

    def json(self, method: str, path: str, body: Any = None) -> Any:
        response = self.request(method, path, body)
        if response.status_code >= 400:
            raise ServerAnswer(response.status_code, error_message(response.content))
        try:
            return response.json()
        except ValueError as exc:
            raise EngineStartFailed(
                f"{self.url}{path} did not answer JSON; is this a vLLM server?"
            ) from exc

    def text(self, path: str) -> str:
        response = self.request("GET", path)
        if response.status_code >= 400:
            raise ServerAnswer(response.status_code, error_message(response.content))
        return response.text

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
        return [int(i) for i in data["tokens"]]

    def tokenize_text(self, model: str, text: str) -> list[int]:
        data = self.json(
            "POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        return [int(i) for i in data["tokens"]]


class SseDecoder:
    """Splits a server-sent-events byte stream into its `data:` payloads.

    Events end with a blank line; a read can hold several events or part of one, so the
    unfinished tail waits for the next read.
    """

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf = (self._buf + data).replace(b"\r\n", b"\n")
        *complete, self._buf = self._buf.split(b"\n\n")
        out: list[str] = []
        for event in complete:
            lines = [
                line[5:].removeprefix(b" ")
                for line in event.split(b"\n")
                if line.startswith(b"data:")
            ]
            if lines:
                out.append(b"\n".join(lines).decode("utf-8", "replace"))
        return out
