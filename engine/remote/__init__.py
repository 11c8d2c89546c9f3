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

from engine.remote.engine import REMOTE_LIMITS, RemoteEngine
from engine.remote.kv_events import KV_EVENTS_FLAGS

__all__ = ["KV_EVENTS_FLAGS", "REMOTE_LIMITS", "RemoteEngine"]
