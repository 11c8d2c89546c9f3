"""One finished request as JSON: kvscope's timings, and beside them the engine's own.

`generate --json`, the bench JSON (per request) and `replay --json` all print this, so a
field means the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

from roofline.step_perf import RESIDUAL_TOLERANCE, perf_check

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.events import RequestFinished, StepSample
    from roofline.step_perf import StepModel


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
    if done.handoff is not None:
        h = done.handoff
        out["handoff"] = {
            **dataclasses.asdict(h),
            "recomputed_tokens": h.recomputed_tokens,
            "loaded_blocks": h.loaded_blocks,
            "loaded_bytes": h.loaded_bytes,
            "fell_back": h.fell_back,
            "ttft_parts_s": dict(h.parts()),
            "words": h.words(),
        }
    return out


def step_records(samples: Sequence[StepSample], model: StepModel | None) -> list[dict[str, Any]]:
    """Each step as JSON: the sample's fields, kvscope's count of it (`perf_model`, when
    `model` is given; it must see every step, in order) and `perf_check`, vLLM's count
    (`perf`) held to kvscope's (roofline/step_perf.py); null where either is missing."""
    rows = []
    for sample in samples:
        modelled = model.observe(sample) if model is not None else None
        if modelled is not None:
            sample = dataclasses.replace(sample, perf_model=modelled.perf)
        row = dataclasses.asdict(sample)
        checked = perf_check(sample.perf, modelled) if sample.perf and modelled else None
        row["perf_check"] = checked.to_dict() if checked is not None else None
        rows.append(row)
    return rows


def step_perf_summary(rows: Sequence[dict[str, Any]], missing: str = "") -> dict[str, Any]:
    """What the steps' two counts say together: how many steps the engine counted (vLLM, or
    a fake's set counts), how many both counted, how many agree within the tolerance once
    the named differences are added, and why kvscope's count is missing (`missing`: no
    model of this engine's geometry)."""
    checked = [r["perf_check"] for r in rows if r["perf_check"] is not None]
    out: dict[str, Any] = {
        "tolerance": RESIDUAL_TOLERANCE,
        "about": (
            "perf is vLLM's count (--enable-mfu-metrics), perf_model kvscope's roofline "
            "model; they agree when vLLM's is kvscope's plus the differences named in "
            "perf_check (attention past causal, activations), within the tolerance"
        ),
        "steps": len(rows),
        "steps_counted_by_engine": sum(1 for r in rows if r["perf"] is not None),
        "steps_compared": len(checked),
        "steps_agree": sum(1 for c in checked if c["agree"]),
    }
    if missing:
        out["missing"] = missing
    return out
