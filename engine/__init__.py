"""The engine boundary: one protocol, the events and errors that cross it, and the engines.

`engine/vllm/` runs vLLM in this process; `engine/remote/` attaches to a running vLLM
server; `engine/fake.py` is the scripted engine for UI tests. Nothing here imports Textual
or `tui`, and only `engine/vllm/` imports vLLM (import-linter contracts in pyproject.toml).
"""
