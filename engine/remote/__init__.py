"""Attach to a running vLLM server: kvscope's Engine protocol over HTTP, /metrics and ZMQ.

Nothing here imports vLLM, torch or transformers: a machine without them can attach to a
GPU server. `RemoteEngine` is the entry point. A server that shows everything:

    python -m vllm.entrypoints.openai.api_server --model MODEL --port 8000 \\
        --enable-prefix-caching --enable-per-request-metrics --enable-prompt-tokens-details \\
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                             "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'

Without --kv-events-config the block map shows occupancy only; without
--enable-per-request-metrics replies carry no server-side timings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.remote.engine import RemoteEngine
    from engine.remote.kv_event_sources import KV_EVENTS_FLAGS
    from engine.remote.server_watch import REMOTE_LIMITS

__all__ = ["KV_EVENTS_FLAGS", "REMOTE_LIMITS", "RemoteEngine"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the CLI's parsers read engine.remote.timeouts for --help,
    # which must not pay for httpx, ZMQ and prometheus_client.
    if name == "RemoteEngine":
        from engine.remote import engine

        return engine.RemoteEngine
    if name == "REMOTE_LIMITS":
        from engine.remote import server_watch

        return server_watch.REMOTE_LIMITS
    if name == "KV_EVENTS_FLAGS":
        from engine.remote import kv_event_sources

        return kv_event_sources.KV_EVENTS_FLAGS
    raise AttributeError(f"module 'engine.remote' has no attribute {name!r}")
