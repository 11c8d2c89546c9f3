"""Where a server's KV events come from: its `--kv-events-config`, as this client reaches it.

The server's `GET /kv_event_sources` says, per data-parallel rank, whether it publishes
and at which endpoint; `plan_sources` turns that into the sockets to open, or the
sentence that says why there are none (NO_EVENTS when the server publishes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KV_EVENTS_FLAGS = (
    "--enable-prefix-caching --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
    '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\''
)
NO_EVENTS = (
    "The server publishes no KV events, so the block map shows occupancy only. To see "
    f"cached blocks, start the server with {KV_EVENTS_FLAGS}."
)


@dataclass(frozen=True)
class EventSource:
    """One publisher (a data-parallel rank) and how this client reaches it."""

    rank: int
    endpoint: str  # what the SUB socket binds or connects to
    bind: bool  # True: the server's PUB connects to us, so we bind there
    replay: str | None  # the server's ROUTER, for a DEALER to connect to


_WILDCARDS = ("*", "0.0.0.0", "::", "[::]", "")


def _tcp_parts(endpoint: str) -> tuple[str, str] | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host, port


def _host_for_tcp(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _reachable(endpoint: str, server_host: str) -> str:
    """A server-side endpoint as this client reaches it (wildcards become the server)."""
    parts = _tcp_parts(endpoint)
    if parts is None:
        return endpoint
    host, port = parts
    if host in _WILDCARDS:
        return f"tcp://{_host_for_tcp(server_host)}:{port}"
    return endpoint


def plan_sources(config: Mapping[str, Any], server_host: str) -> tuple[list[EventSource], str]:
    """From `GET /kv_event_sources` (rank -> KVEventsConfig): what to open, or why not.

    vLLM's PUB binds when its endpoint has a wildcard (`tcp://*:5557`), ipc:// or inproc://,
    and CONNECTS to any concrete tcp address: then the subscriber must bind that address,
    which works only on the machine it names.
    """
    sources: list[EventSource] = []
    problems: list[str] = []
    for key, cfg in sorted(config.items(), key=lambda kv: str(kv[0])):
        if not isinstance(cfg, Mapping):
            continue
        try:
            rank = int(key)
        except (TypeError, ValueError):
            rank = 0
        if not cfg.get("enable_kv_cache_events") or cfg.get("publisher") not in (None, "zmq"):
            continue
        endpoint = str(cfg.get("endpoint") or "")
        replay = cfg.get("replay_endpoint")
        replay_at = _reachable(str(replay), server_host) if replay else None
        parts = _tcp_parts(endpoint)
        if endpoint.startswith("ipc://"):
            sources.append(EventSource(rank, endpoint, False, replay_at))
        elif parts is None:
            problems.append(
                f"rank {rank} publishes to {endpoint or 'nowhere'}, which no other process "
                "can reach"
            )
        elif parts[0] in _WILDCARDS:
            sources.append(EventSource(rank, _reachable(endpoint, server_host), False, replay_at))
        else:
            sources.append(EventSource(rank, endpoint, True, replay_at))
    if sources:
        return sources, ""
    if problems:
        return [], "KV events cannot reach this client: " + "; ".join(problems) + "."
    return [], NO_EVENTS
