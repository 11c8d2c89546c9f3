"""How the session's engine and server are configured (tests/conftest.py starts them):
the figures tests derive their expectations from."""

from __future__ import annotations

# The session's engines compute in float32. On a CPU without bf16 units (AVX2 only) vLLM's
# bf16 matmuls fall back to torch's emulation: a 512-token prefill took 6.8 s there in bf16
# and 1.1 s in float32 (decode 59 vs 67 ms a token), and the suite is sized for that CPU.
# Every figure a test checks is derived from the card (bytes per token, blocks), so the
# dtype only moves numbers that are read, not asserted. The bad-input subprocesses keep
# vLLM's own choice (bf16): the CLI is checked as a user runs it.
TEST_DTYPE = "float32"
TEST_DTYPE_BYTES = 4
# Small enough to start fast and to fill; large enough for one 4,096-token request (5,825
# tokens of float32 KV, 46,080 bytes each). The same fixed pool and eager mode on a GPU
# (kvscope's CPU defaults are no GPU's defaults).
ENGINE_KV_BYTES = 256 * 1024**2
ENGINE_ARGV = [
    "--max-model-len", "4096", "--kv-cache-memory-bytes", str(ENGINE_KV_BYTES), "--enforce-eager",
    "--dtype", TEST_DTYPE,
]  # fmt: skip
