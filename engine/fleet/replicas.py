"""The replicas of a fleet, from `--replica URL` or `--replica name=URL`, named and checked.

A replica's URL is parsed by engine/remote's own parser, so a user and password written
into it become an Authorization header and are never part of the URL kvscope keeps,
prints or writes. Unnamed replicas are called a, b, c, ... in the order given, skipping
any name given explicitly: the words on screen ("cached on replica b") stay short.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from engine.errors import BadOption
from engine.remote.client import ServerUrl, parse_server_url, safe_url

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from urllib.parse import SplitResult

OPTION = "--replica"
MAX_REPLICAS = 64
# Short enough for a table column; no ':' or '/' so `name=URL` never reads as a URL.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,15}$")


@dataclass(frozen=True)
class Replica:
    """One vLLM server of the fleet."""

    name: str
    where: ServerUrl
    """Its root URL (no credentials) and the Authorization header they became, if any."""

    @property
    def url(self) -> str:
        """The root URL, safe to print: never a user or password."""
        return self.where.root

    def __str__(self) -> str:
        return f"{self.name}={self.url}"


def _letters(i: int) -> str:
    """0 -> a, 25 -> z, 26 -> aa: spreadsheet column names."""
    name = ""
    i += 1
    while i:
        i, rest = divmod(i - 1, 26)
        name = chr(ord("a") + rest) + name
    return name


def _split(text: str) -> tuple[str | None, str]:
    """`name=URL` into its two parts; a bare URL (even one with `=` in its query) has none."""
    name, eq, url = text.strip().partition("=")
    if eq and not name.strip():
        raise BadOption(OPTION, empty_name(text))
    if eq and _NAME.match(name.strip()):
        return name.strip(), url.strip()
    if eq and name.strip() and not any(c in name for c in ":/?#@"):
        raise BadOption(
            OPTION,
            f"{name.strip()!r} is not a replica name: use a letter, then up to 15 letters, "
            "digits, '.', '_' or '-' (e.g. a=http://127.0.0.1:8001)",
        )
    return None, text.strip()


def empty_name(given: str) -> str:
    """The words for `=URL`: a name left empty, not a URL that is not http://."""
    return (
        f"{safe_url(given.strip())!r}: the name before '=' is empty; give one "
        "(name=URL) or leave out the '='"
    )


def same_server(a: str, b: str) -> bool:
    """Whether two root URLs reach one server: the same port and path on one host, whose
    names may differ (localhost is 127.0.0.1; a trailing / or /v1 is already gone from a
    root). A name that does not resolve is compared as written."""
    pa, pb = urlsplit(a), urlsplit(b)
    if _port(pa) != _port(pb) or pa.path.rstrip("/") != pb.path.rstrip("/"):
        return False
    ha, hb = (pa.hostname or "").lower(), (pb.hostname or "").lower()
    return ha == hb or bool(_addresses(ha) & _addresses(hb))


def _port(parts: SplitResult) -> int | None:
    try:
        port = parts.port
    except ValueError:
        return None
    return port if port is not None else {"http": 80, "https": 443}.get(parts.scheme)


def _addresses(host: str) -> set[str]:
    """The addresses `host` names; a server on 0.0.0.0 (or ::) answers on loopback too."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return {host}
    if found & {"0.0.0.0", "::"}:
        found |= {"127.0.0.1", "::1"}
    return found


def _url(text: str, given: str) -> ServerUrl:
    try:
        return parse_server_url(text)
    except BadOption as exc:
        raise BadOption(OPTION, f"{safe_url(given.strip())!r}: {exc.reason}") from None


class ReplicaSet:
    """The fleet's replicas, in the order given; looked up by name or by URL."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = tuple(replicas)
        self._by_name = {r.name: r for r in self._replicas}
        self._by_url = {r.url: r for r in self._replicas}

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._replicas)

    def __len__(self) -> int:
        return len(self._replicas)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._replicas)

    def named(self, name: str) -> Replica | None:
        return self._by_name.get(name)

    def at(self, url: str) -> Replica | None:
        """The replica whose root this URL is (a router names workers by URL)."""
        try:
            root = parse_server_url(url).root
        except BadOption:
            return None
        return self._by_url.get(root)


def parse_replicas(texts: Sequence[str]) -> ReplicaSet:
    """Every `--replica` value, in order; raises BadOption with the reason for a bad one.

    Refused: an empty list, more than MAX_REPLICAS, a URL that is not http(s), a bad
    name, two replicas with one name, and one server given twice (the same root URL).
    """
    if not texts:
        raise BadOption(OPTION, "no replica given; e.g. --replica http://127.0.0.1:8001")
    if len(texts) > MAX_REPLICAS:
        raise BadOption(
            OPTION, f"{len(texts)} replicas given; kvscope follows at most {MAX_REPLICAS}"
        )
    split = [_split(t) for t in texts]
    explicit = [name for name, _ in split if name is not None]
    for dup in explicit:
        if explicit.count(dup) > 1:
            raise BadOption(OPTION, f"two replicas are named {dup!r}; give each its own name")
    taken = set(explicit)
    replicas: list[Replica] = []
    seen: dict[str, str] = {}
    letter = 0
    for (name, url_text), given in zip(split, texts, strict=True):
        where = _url(url_text, given)
        if name is None:
            while _letters(letter) in taken:
                letter += 1
            name = _letters(letter)
            taken.add(name)
            letter += 1
        if where.root in seen:
            raise BadOption(
                OPTION,
                f"{where.root} is given twice (as {seen[where.root]!r} and {name!r}); one "
                "server is one replica",
            )
        twin = next((r for r in seen if same_server(r, where.root)), None)
        if twin is not None:
            raise BadOption(
                OPTION,
                f"{seen[twin]}={twin} and {name}={where.root} are one server (the same port "
                "on the same host); one server is one replica",
            )
        seen[where.root] = name
        replicas.append(Replica(name, where))
    return ReplicaSet(replicas)
