"""vLLM's count of each step held to kvscope's (issue #32), for the roofline box's line.

In-process, vLLM counts every step's FLOPs and bytes with its own analytic model
(`--enable-mfu-metrics`, StepSample.perf). kvscope counts the same scheduled tokens with
roofline/step_perf.py; `perf_check` says whether the two agree within its tolerance once
the differences the models name are added. The roofline's points are vLLM's count; this
line says whether kvscope's own arithmetic backs them, and names the step where not.

Fed on the UI loop, once per step sample: StepModel.observe is a pass over the step's
requests, and the check a few divisions. Measured on this 2-core CPU (under load): about
18 us a step of 1 or 16 requests, 110 us of 256 (the model's pass; the check is ~5 us), so
at GPU scale (256 requests, ~30 steps/s) about 3 ms of the loop a second. No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import KvscopeError
from roofline.step_perf import RESIDUAL_TOLERANCE, StepModel, perf_check

if TYPE_CHECKING:
    from engine.events import ModelCard, StepSample
    from roofline.step_perf import PerfCheck


def step_model_for(card: ModelCard | None, *, remote: bool = False) -> tuple[StepModel | None, str]:
    """kvscope's model of the engine's steps, or why there is none ("" where nothing is
    worth saying: a fake, whose counts are set from its own config, or a server, whose
    points are scrape windows, not steps). Reads the model's config.json: off the loop."""
    if card is None or remote or card.device == "fake":
        return None, ""
    if card.parallel:
        # vLLM counts per GPU of the model's split; kvscope's model is of the whole model.
        return None, f"vLLM counts per GPU of {card.parallel}; kvscope's model is one device's"
    from roofline.hardware import load_geometry

    try:
        return StepModel.for_card(load_geometry(card.path), card), ""
    except (KvscopeError, OSError, ValueError, KeyError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        return None, f"kvscope has no roofline model of {card.name}: {reason}"


@dataclass(frozen=True, slots=True)
class Disagreement:
    """The first step whose counts disagree: its number and the check's figures."""

    step: int
    check: PerfCheck

    def words(self) -> str:
        """The quantity furthest past the tolerance (vLLM's count against kvscope's plus
        the named differences): "first step 12, vLLM's flops +9.1 %"."""
        key, residual = max(self.check.residual.items(), key=lambda kv: abs(kv[1]))
        return f"first step {self.step:,}, vLLM's {key} {_pct(residual, 1, sign=True)}"


class PerfAgreement:
    """How many steps vLLM counted, how many agree with kvscope's count, and the first
    that did not. `version` moves with every checked step (the box redraws on it)."""

    def __init__(self, model: StepModel | None = None, missing: str = "") -> None:
        self.model = model
        self.missing = missing
        """Why there is no model, in words ("" when there is one, or nothing to say)."""
        self.tolerance = RESIDUAL_TOLERANCE
        self.steps = 0
        self.agreed = 0
        self.worst = 0.0  # the largest |residual| of an agreeing step
        self.first: Disagreement | None = None
        self.version = 0

    def observe(self, sample: StepSample) -> None:
        """Count `sample` with kvscope's model (every step: the model keeps each request's
        context), and check vLLM's count of it where there is one."""
        model = self.model
        if model is None:
            return
        modelled = model.observe(sample)
        perf = sample.perf
        if modelled is None or perf is None:
            return
        check = perf_check(perf, modelled, self.tolerance)
        self.steps += 1
        if check.agree:
            self.agreed += 1
            worst = max(abs(r) for r in check.residual.values())
            if worst > self.worst:
                self.worst = worst
        elif self.first is None:
            self.first = Disagreement(sample.step, check)
        self.version += 1

    def clear(self, *, contexts: bool = False) -> None:
        """Forget the tallies (F9 clears the plots); with `contexts`, the requests the
        model knows too (a replay rewound: its steps come again from the start)."""
        self.steps = self.agreed = 0
        self.worst = 0.0
        self.first = None
        if contexts and self.model is not None:
            self.model = StepModel(self.model.geom)
        self.version += 1

    def words(self) -> str:
        """The box's line: "vLLM's count and kvscope's agree within 2 % (16 steps)", or
        the disagreement named, or why there is no comparison ("" for none to make)."""
        if self.model is None:
            return f"kvscope's count: {self.missing}" if self.missing else ""
        if not self.steps:
            return ""
        n = f"{self.steps:,} step{'s' if self.steps != 1 else ''}"
        within = _pct(self.tolerance)
        if self.first is None:
            # One line in the 58 columns the box has at 160x48.
            return f"vLLM's count and kvscope's agree within {within} ({n})"
        off = self.steps - self.agreed
        return (
            f"vLLM's count and kvscope's disagree on {off:,} of {n} (past {within}): "
            f"{self.first.words()}"
        )


def _pct(share: float, digits: int = 0, *, sign: bool = False) -> str:
    """A share as the panels write percentages: "2 %", "+9.1 %"."""
    return f"{share * 100:{'+' if sign else ''}.{digits}f} %"
