"""One finished request as JSON: kvscope's timings, and beside them the engine's own.

`generate --json`, the bench JSON (per request) and `replay --json` all print this, so a
field means the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.events import RequestFinished


def request_record(done: RequestFinished) -> dict[str, Any]:
    """kvscope's figures (from the caller's clock) and, where the engine has them, its own:
    `vllm_*` in-process, `server_*` from a remote server's per-request metrics."""
    out: dict[str, Any] = {
        "request_id": done.request_id,
        "prompt_tokens": done.prompt_tokens,
        "output_tokens": done.output_tokens,
        "finish_reason": done.reason,
        "ttft_s": done.ttft_s,
        "itl_s": list(done.itl_s),
        "e2e_s": done.e2e_s,
        "preemptions": done.preemptions,
        "cached_prompt_tokens": done.cached_prompt_tokens,
    }
    if done.anatomy is not None:
        out["ttft_breakdown"] = {
            "queue_s": done.anatomy.queue_s,
            "prefill_s": done.anatomy.prefill_s,
            "prefill_chunks": done.anatomy.chunks,
            "others_s": done.anatomy.others_s,
            "preempted_s": done.anatomy.preempted_s,
        }
    v = done.vllm
    if v is not None:
        out["vllm_ttft_s"] = v.ttft_s
        out["vllm_itl_s"] = list(v.itl_s)
        out["vllm_queue_s"] = v.queue_s
        out["kvscope_queue_s"] = v.kvscope_queue_s
        if v.itl_s and len(v.itl_s) == len(done.itl_s):
            out["median_abs_itl_diff_s"] = statistics.median(
                abs(a - b) for a, b in zip(done.itl_s, v.itl_s, strict=True)
            )
    if done.server is not None:
        out["server"] = dataclasses.asdict(done.server)
    if done.fleet is not None:
        out["fleet"] = dataclasses.asdict(done.fleet)
    return out
