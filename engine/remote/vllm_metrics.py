"""The names of the Prometheus metrics kvscope reads from a vLLM server, in one place.

Each is the sample name as it appears in /metrics text. vLLM declares its counters without
the `_total` that prometheus_client adds when it writes them, so the counters here carry
it; a histogram is named by its base, and its samples are that name plus `_bucket`,
`_count` and `_sum`. What each comment says is vLLM's own description (vLLM 0.32,
`vllm/v1/metrics/loggers.py`), with what kvscope takes from it.

Every vLLM server metric carries the labels `model_name` (the served name) and `engine`
(the data-parallel rank). A server that names its metrics otherwise is read through this
module alone.
"""

from __future__ import annotations

PREFIX = "vllm:"
"""Every vLLM server metric starts so; a /metrics text with none is not a vLLM server's
(or a proxy hides them)."""

# -- gauges ---------------------------------------------------------------------------------
RUNNING = "vllm:num_requests_running"
"""Requests in model execution batches: those the scheduler is running now."""

WAITING = "vllm:num_requests_waiting"
"""Requests waiting to be processed: queued, not yet scheduled."""

WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
"""WAITING split by a `reason` label: "capacity" (waiting for scheduling capacity) or
"deferred" (held back by a transient constraint: LoRA budget, KV transfer, a blocked
status). The reasons add up to WAITING."""

KV_USAGE = "vllm:kv_cache_usage_perc"
"""KV-cache usage as a fraction of the pool, 1 meaning full (despite the name, not a
percentage)."""

CACHE_INFO = "vllm:cache_config_info"
"""An info gauge (always 1) whose labels are the KV cache's configuration: `block_size`,
`num_gpu_blocks` (summed over data-parallel engines), `enable_prefix_caching`,
`cache_dtype`, `kv_cache_size_tokens`. kvscope's KV pool comes from these labels."""

# -- counters (since the server started) ------------------------------------------------------
PROMPT_TOKENS = "vllm:prompt_tokens_total"
"""Prefill tokens processed: how fast the server reads prompts."""

GENERATION_TOKENS = "vllm:generation_tokens_total"
"""Generation tokens processed: how fast the server writes replies."""

PREEMPTIONS = "vllm:num_preemptions_total"
"""Preemptions: running requests the scheduler evicted to free KV blocks."""

PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
"""Prefix-cache queries, counted in tokens looked up."""

PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
"""Prefix-cache hits, counted in tokens found cached: hits / queries is the hit rate."""

ESTIMATED_FLOPS = "vllm:estimated_flops_per_gpu_total"
"""FLOPs per GPU by vLLM's analytic model of the architecture (`vllm/v1/metrics/perf.py`),
summed over every step. Only a server started with `--enable-mfu-metrics` has it (and the
two byte counters below); kvscope takes the deltas between scrapes as one roofline point
per scrape window."""

ESTIMATED_READ_BYTES = "vllm:estimated_read_bytes_per_gpu_total"
"""Bytes read from memory per GPU (weights, KV cache, activations), by the same model."""

ESTIMATED_WRITE_BYTES = "vllm:estimated_write_bytes_per_gpu_total"
"""Bytes written to memory per GPU (KV cache, activations), by the same model."""

MFU_FLAG = "--enable-mfu-metrics"
"""The `vllm serve` flag that turns the three estimated counters on."""

# -- histograms (seconds, per request) -----------------------------------------------------------
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
"""From the request's arrival at the engine to its first token."""

INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
"""Between consecutive output tokens of one request."""

QUEUE_TIME = "vllm:request_queue_time_seconds"
"""Time spent in the WAITING phase, before the request is first scheduled."""

E2E_LATENCY = "vllm:e2e_request_latency_seconds"
"""From arrival to the request's end."""

# -- vllm-router (the fleet's router, on its own --prometheus-port) -----------------------------
ROUTER_PROCESSED = "vllm_router_processed_requests_total"
"""Requests the router has forwarded, one sample per worker (its `worker` label is the
worker's URL). Not a `vllm:` metric: the router's own, never on a server's /metrics."""
