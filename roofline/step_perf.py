"""kvscope's roofline count of one engine step, beside vLLM's own count of the same step.

A step runs some requests' tokens: a prompt chunk of n tokens, or one decode token, each
over a context of C tokens (its KV once the step is done). kvscope's model of it is the
floor's (roofline/floors.py), step by step:

    FLOPs  2 x non-embedding parameters x tokens      (every matmul, once a token)
         + 4 x layers x heads x head_dim x pairs      (QK^T and AV; causal pairs:
                                                       a chunk's n queries see n x C
                                                       - n(n-1)/2 keys)
         + 2 x vocab x hidden x requests              (logits for each request's last token)
    read   every weight once (the input embedding only where it is also the lm_head: a
           lookup reads a few rows, not the table) + the KV of each request's context
    write  the KV of the tokens computed

Bytes are only what must move; a fused kernel keeps the activations between matmuls on
chip. vLLM's analytic model (`vllm/v1/metrics/perf.py`, `--enable-mfu-metrics`) counts the
same matmuls, but also:
- attention of every prompt token against the whole context (n x C pairs, not causal);
- every layer's activations read and written (its inputs and outputs, and the logits).
`vllm_only` counts those from the same geometry, so that the two counts can be held to
each other (`perf_check`): once the named differences are added to kvscope's, the two must
agree within `RESIDUAL_TOLERANCE`, or the step is counted wrong on one side.

Cheap on purpose (it runs every step): a few multiplications per request. Pure Python: no
engine, torch or vLLM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.events import StepPerf
from engine.sizes import dtype_bytes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.events import ModelCard, StepSample
    from roofline.geometry import ModelGeometry

KVSCOPE_SOURCE = "kvscope"
VLLM_ONLY_SOURCE = "vllm only"

RESIDUAL_TOLERANCE = 0.02
"""How far vLLM's count may sit from kvscope's plus the named differences. What neither
names is the RMSNorms and biases (kvscope counts their parameters as matmul work and
weight reads, vLLM does not): under 0.1 % of a layer's parameters for a Llama-style model
(SmolLM2-135M: 0.03 % of its FLOPs and reads, measured), and integer rounding. 2 % leaves
room for a model with biases; a count that belongs to another step misses by far more (a
prompt's step is hundreds of decode steps). Not modelled, so reported as disagreeing:
sliding-window attention (vLLM clamps the context to the window) and mixture-of-experts
models (no geometry for them here)."""


@dataclass(frozen=True, slots=True)
class RequestSlice:
    """One request's part of one step."""

    tokens: int  # computed in this step: a prompt chunk, or a decode token
    context: int  # tokens in its KV once the step is done (these included)


@dataclass(frozen=True, slots=True)
class ModelledStep:
    """kvscope's count of a step, and what vLLM's model counts beyond it (see module)."""

    perf: StepPerf  # source "kvscope"
    vllm_only: StepPerf  # source "vllm only": attention past causal, activations
    attention_flops: float  # of vllm_only.flops: pairs past the causal ones


class StepModel:
    """kvscope's count of each step of one engine, fed its StepSamples in order.

    A request's context is read off the step's blocks (its tokens with KV once the step is
    done); one that finished in the step is gone from them, so the model keeps each
    request's last context and adds the step's tokens.
    """

    def __init__(self, geom: ModelGeometry) -> None:
        self.geom = geom
        g = geom
        e = g.dtype_bytes
        self._matmul_flops = 2.0 * g.non_embedding_params  # per token
        self._pair_flops = 4.0 * g.num_layers * g.num_attention_heads * g.head_dim
        self._logit_flops = 2.0 * g.vocab_size * g.hidden_size  # per request
        untied_table = 0 if g.tie_word_embeddings else g.vocab_size * g.hidden_size
        self._weights = float((g.num_params - untied_table) * e)
        self._kv = float(g.kv_bytes_per_token)
        # vLLM's activations, per token per layer (perf.py's AttentionMetrics, FfnMetrics):
        # read: the qkv input (h), the queries (n_q d), the o_proj input (n_q d), the MLP
        # input (h), its gate and up outputs into SiLU (2 i) and the down input (i).
        # written: q, k, v (n_q d + 2 n_kv d), o_proj's output (h), gate and up (2 i),
        # SiLU's (i) and down's (h). Per request with logits: its hidden state read, its
        # vocab of logits written.
        h, i, d = g.hidden_size, g.intermediate_size, g.head_dim
        q, kv = g.num_attention_heads, g.num_kv_heads
        self._act_read = float((2 * h + 2 * q * d + 3 * i) * g.num_layers * e)
        self._act_write = float(((q + 2 * kv) * d + 2 * h + 3 * i) * g.num_layers * e)
        self._logit_read = float(h * e)
        self._logit_write = float(g.vocab_size * e)
        self._context: dict[str, int] = {}

    @classmethod
    def for_card(cls, geom: ModelGeometry, card: ModelCard) -> StepModel:
        """The model of the engine `card` describes: its dtype's bytes, not the default."""
        known = card.dtype and card.dtype != "unknown"
        elem = dtype_bytes(card.dtype) if known else geom.dtype_bytes
        return cls(dataclasses.replace(geom, dtype_bytes=elem))

    def observe(self, sample: StepSample) -> ModelledStep | None:
        """kvscope's count of `sample` (None for a step with no work, or an idle one);
        keeps each request's context for the next step. One pass over the step's requests,
        no object made per request: it runs on every step of a 256-request batch."""
        if sample.idle:
            return None
        after = {b.request_id: b.num_tokens for b in sample.blocks}
        before = self._context
        now: dict[str, int] = {}
        tokens = requests = pairs = full_pairs = context = 0
        for w in sample.work:
            n = w.prefill_tokens + w.decode_tokens
            if n <= 0:
                continue
            rid = w.request_id
            c = max(after.get(rid) or before.get(rid, 0) + n, n)
            now[rid] = c
            tokens += n
            requests += 1
            context += c
            full_pairs += n * c
            pairs += n * c - n * (n - 1) // 2
        # Requests still running but not in this step keep theirs; finished ones go.
        for rid, c in after.items():
            now.setdefault(rid, c)
        self._context = now
        if not requests:
            return None
        return self._counted(tokens, requests, pairs, full_pairs, context)

    def attach(self, sample: StepSample) -> StepSample:
        """`sample` with kvscope's count as its `perf_model`."""
        modelled = self.observe(sample)
        return dataclasses.replace(sample, perf_model=modelled.perf if modelled else None)

    def count(self, parts: Iterable[RequestSlice]) -> ModelledStep:
        """kvscope's count of a step of these requests' parts (no context kept)."""
        tokens = requests = pairs = full_pairs = context = 0
        for s in parts:
            tokens += s.tokens
            requests += 1
            context += s.context
            full_pairs += s.tokens * s.context
            pairs += s.tokens * s.context - s.tokens * (s.tokens - 1) // 2
        return self._counted(tokens, requests, pairs, full_pairs, context)

    def _counted(
        self, tokens: int, requests: int, pairs: int, full_pairs: int, context: int
    ) -> ModelledStep:
        flops = tokens * self._matmul_flops + pairs * self._pair_flops
        flops += requests * self._logit_flops
        perf = StepPerf(
            flops=flops,
            read_bytes=self._weights + context * self._kv,
            write_bytes=tokens * self._kv,
            source=KVSCOPE_SOURCE,
        )
        attention = (full_pairs - pairs) * self._pair_flops
        extra = StepPerf(
            flops=attention,
            read_bytes=tokens * self._act_read + requests * self._logit_read,
            write_bytes=tokens * self._act_write + requests * self._logit_write,
            source=VLLM_ONLY_SOURCE,
        )
        return ModelledStep(perf, extra, attention)


@dataclass(frozen=True, slots=True)
class PerfCheck:
    """vLLM's count of a step held to kvscope's: `agree` when each quantity is within
    `tolerance` of kvscope's plus the named differences; `differences` names each one
    that is larger than the tolerance, with its size."""

    agree: bool
    tolerance: float
    residual: dict[str, float]  # per quantity: vLLM / (kvscope + named) - 1
    differences: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "agree": self.agree,
            "tolerance": self.tolerance,
            "residual": self.residual,
            "differences": list(self.differences),
        }


_UNIT_AND_WHY = {
    "flops": (
        "FLOP",
        "vLLM counts each prompt token against the whole context, kvscope only the "
        "tokens before it (causal)",
    ),
    "read bytes": (
        "B",
        "vLLM also counts every layer's activations read; kvscope only weights and KV",
    ),
    "write bytes": (
        "B",
        "vLLM also counts every layer's activations and the logits written; kvscope only the KV",
    ),
}


def _quantities(perf: StepPerf) -> dict[str, float]:
    return {"flops": perf.flops, "read bytes": perf.read_bytes, "write bytes": perf.write_bytes}


def perf_check(
    vllm: StepPerf, modelled: ModelledStep, tolerance: float = RESIDUAL_TOLERANCE
) -> PerfCheck:
    """Whether vLLM's count of a step is kvscope's plus the differences the two models
    name, within `tolerance`; each named difference past the tolerance said in words."""
    theirs_all = _quantities(vllm)
    ours_all = _quantities(modelled.perf)
    named_all = _quantities(modelled.vllm_only)
    residual: dict[str, float] = {}
    words = []
    for key, (unit, why) in _UNIT_AND_WHY.items():
        theirs, ours, named = theirs_all[key], ours_all[key], named_all[key]
        explained = ours + named
        residual[key] = theirs / explained - 1 if explained > 0 else float(theirs > 0)
        if abs(theirs - ours) > tolerance * max(theirs, ours):
            words.append(
                f"{key}: vLLM {_si(theirs, unit)}, kvscope {_si(ours, unit)}: {why} "
                f"({_si(named, unit)} here)"
            )
    agree = all(abs(r) <= tolerance for r in residual.values())
    return PerfCheck(agree, tolerance, residual, tuple(words))


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
