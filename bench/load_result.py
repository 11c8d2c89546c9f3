"""A load run's result: its config, one point per load level, and their JSON and CSV form.

A point's figures carry `vllm bench serve`'s names (`request_throughput`,
`output_throughput`, `total_token_throughput`, `mean_ttft_ms`, `p99_itl_ms`,
`max_concurrency`, `request_rate`, `burstiness`, `request_goodput`, ...), so a kvscope
JSON reads beside vLLM's. Beside them, `steps`: kvscope's own view of the engine's
scheduler over the point (batch, queue, KV, preemptions, prefill's share of step time),
where the engine shows its steps.

Failed requests are never left out, as `vllm bench serve` says "Failed requests": a
point counts them (`failed`, and `failed_by_cause`: "HTTP 500", "cut", "timeout",
"replica down", ...), keeps each in `requests` with its cause and what it got before it
failed, and is not `ok` when any failed (its figures then describe the survivors only).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from bench.sweep_result import point_record, roofs_record

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bench.arrivals import ArrivalKind
    from roofline.point_perf import PointRoofline, PointRoofs

LoadMode = Literal["concurrency", "rate"]
Profile = Literal["concurrency", "rate", "synchronous", "throughput"]
"""How a point's load was made: N users (closed loop) or R requests/s (open loop); a
`--sweep` names its first two points after GuideLLM's profiles."""


@dataclass(frozen=True)
class LoadConfig:
    """What every point of a load run shares."""

    mode: LoadMode
    levels: tuple[float, ...]  # users (whole numbers) or requests/s (inf allowed)
    prompt_len: int = 512
    output_len: int = 128
    range_ratio: float = 0.0  # lengths drawn uniformly from [n(1-r), n(1+r)], as vLLM's
    num_prompts: int | None = None  # per point; None: by duration
    duration_s: float | None = None
    warmup: int = 1
    arrival: ArrivalKind = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    shared_prefix: int = 0  # tokens every prompt of a point starts with (0: none)
    goodput: dict[str, float] = field(default_factory=dict)  # SLO name -> ms
    sweep: bool = False
    find_max: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levels"] = [_num(v) for v in self.levels]
        return out


@dataclass(frozen=True)
class StepView:
    """What the engine's own steps showed over one point (in-process engines; a server's
    /metrics scrapes give the queue, batch and KV, not the steps' split)."""

    source: Literal["steps", "scrapes"]
    samples: int
    mean_running: float
    max_running: int
    mean_waiting: float
    max_waiting: int
    mean_kv_usage: float  # 0..1
    max_kv_usage: float
    preemptions: int
    prefill_time_share: float | None = None  # of the steps' time, the prefill share
    waiting_step_share: float | None = None  # steps that ended with requests waiting
    kv_bound_share: float | None = None  # of those, the share where KV blocks were short
    budget_bound_share: float | None = None  # ... and where the blocks were there


@dataclass(frozen=True)
class LoadPoint:
    """One load level's figures, with `vllm bench serve`'s field names (milliseconds)."""

    profile: Profile
    max_concurrency: int | None  # the users of a closed loop; None: open loop
    request_rate: float | None  # requests/s of an open loop (inf: all at once)
    burstiness: float | None
    ok: bool = True  # False when the point failed, or any of its requests did
    error: str | None = None
    completed: int = 0
    failed: int = 0  # requests that ended in an error: `failed_by_cause` says which
    aborted: int = 0  # in flight when the point stopped early
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    duration_s: float = 0.0
    request_throughput: float = 0.0
    output_throughput: float = 0.0
    total_token_throughput: float = 0.0
    request_goodput: float | None = None
    slo_ttft_within: float | None = None
    slo_tpot_within: float | None = None
    slo_e2el_within: float | None = None
    slo_all_within: float | None = None
    mean_ttft_ms: float = 0.0
    median_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    mean_tpot_ms: float = 0.0
    median_tpot_ms: float = 0.0
    p90_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    mean_itl_ms: float = 0.0
    median_itl_ms: float = 0.0
    p90_itl_ms: float = 0.0
    p99_itl_ms: float = 0.0
    mean_e2el_ms: float = 0.0
    median_e2el_ms: float = 0.0
    p90_e2el_ms: float = 0.0
    p99_e2el_ms: float = 0.0
    max_concurrent_requests: int = 0  # the most in flight at once, as the client saw it
    queued_requests: int = 0  # requests that waited in the engine's queue (steps only)
    schedule_error_p50_ms: float | None = None  # actual - planned send (open loop)
    schedule_error_p99_ms: float | None = None
    cached_prompt_tokens: int | None = None  # prefix-cache hits, where the engine says
    roofline_output_throughput: float | None = None  # the batched-decode ceiling
    stopped_early: str | None = None  # why the point ended before its plan
    notes: tuple[str, ...] = ()
    steps: StepView | None = None
    requests: tuple[dict[str, Any], ...] = ()
    # The point on the roofline (FLOP/s, bytes/s, intensity), or why not; None: not asked.
    roofline: PointRoofline | None = None

    @property
    def label(self) -> str:
        return level_label(self.profile, self.max_concurrency, self.request_rate)

    @property
    def sent(self) -> int:
        """Every request the point sent: completed, failed or aborted."""
        return self.completed + self.failed + self.aborted

    @property
    def failed_by_cause(self) -> dict[str, int]:
        """Failed requests by cause, most first. Read from `requests`, where each failed
        one says its cause, so a saved file gives the same counts back."""
        counts = Counter(str(r["failure"]) for r in self.requests if r.get("failure"))
        unknown = self.failed - sum(counts.values())
        if unknown > 0:  # a file from before causes were kept
            counts["unknown"] += unknown
        return dict(counts.most_common())

    def failure_words(self) -> str | None:
        """How many of the point's requests failed, and why; None when none did."""
        if not self.failed:
            return None
        return failure_words(self.failed, self.sent, self.failed_by_cause)

    @property
    def level(self) -> float:
        """The load level on its mode's axis (users, or requests/s)."""
        if self.request_rate is not None:
            return self.request_rate
        return float(self.max_concurrency or 0)

    def value(self, name: str) -> float | None:
        if self.steps is not None and name in _STEP_NAMES:
            v = getattr(self.steps, name)
        else:
            v = getattr(self, name, None)
        return None if v is None or isinstance(v, str) else float(v)

    def row(self) -> dict[str, Any]:
        """The flat figures: the CSV row, and the JSON point without its requests."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("requests", "steps", "notes", "roofline"):
                continue
            out[f.name] = _num(getattr(self, f.name))
        out["label"] = self.label
        out["failed_by_cause"] = self.failed_by_cause
        out["notes"] = " ".join(self.notes)
        if self.steps is not None:
            out.update({f"steps_{k}": _num(v) for k, v in asdict(self.steps).items()})
        return out


_STEP_NAMES = frozenset(f.name for f in fields(StepView))


@dataclass
class LoadResult:
    config: LoadConfig
    points: list[LoadPoint] = field(default_factory=list)
    model: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    complete: bool = True
    find_max: dict[str, Any] | None = None  # the search's answer, when one ran
    roofs: PointRoofs | str | None = None  # what each point's share is of, or why none

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "load",
            "config": self.config.to_dict(),
            "seed": self.config.seed,
            "complete": self.complete,
            "model": self.model,
            "hardware": self.hardware,
            "find_max": self.find_max,
            **roofs_record(self.roofs),
            "points": [
                {**p.row(), **point_record(p.roofline, self.roofs), "requests": list(p.requests)}
                for p in self.points
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        rows = [p.row() for p in self.points]
        names = list(rows[0]) if rows else [f.name for f in fields(LoadPoint)]
        for r in rows[1:]:
            names += [k for k in r if k not in names]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            # A cell holds one value: the causes as "HTTP 500: 7; cut: 1".
            causes = r.get("failed_by_cause") or {}
            r["failed_by_cause"] = "; ".join(f"{k}: {v}" for k, v in causes.items())
            writer.writerow(r)
        return buf.getvalue()


def _num(v: Any) -> Any:
    # JSON has no infinity: a rate of inf is written as the string "inf", as it is typed.
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return v


def failure_words(failed: int, sent: int, causes: Mapping[str, int]) -> str:
    """Say "7 of 8 requests failed (HTTP 500: 7)", the causes most first."""
    ordered = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
    why = ", ".join(f"{cause}: {n}" for cause, n in ordered)
    return f"{failed} of {sent} requests failed" + (f" ({why})" if why else "")


def level_label(profile: Profile, users: int | None, rate: float | None) -> str:
    """A load level in a few words: "4 users", "2.5 req/s", "rate inf", "sync"."""
    if profile == "synchronous":
        return "sync"
    if rate is None:
        return "1 user" if users == 1 else f"{users} users"
    return "rate inf" if math.isinf(rate) else f"{rate:g} req/s"
