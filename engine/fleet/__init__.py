"""A fleet: several vLLM replicas, usually behind a router (vLLM's `vllm-router`).

Each replica is a vLLM server attached the way engine/remote attaches to one: /metrics
scrapes and, where it publishes them, its KV-event stream. This package adds what only a
fleet has: named replicas (`replicas`), one row per replica and an imbalance line
(`fleet_state`), the prefix-cache index across replicas (`prefix_index`), and which
replica served a request (`attribution`). Like engine/remote it imports no vLLM.
"""
