"""In-process, the roofline box says whether vLLM's count of each step agrees with
kvscope's (issue #32): roofline/step_perf.py's model of the same scheduled tokens, held to
it by `perf_check` within RESIDUAL_TOLERANCE.

vLLM's own count needs vLLM (tests/test_step_perf.py holds it to kvscope's on the real
engine). Here the engine's count of a step is kvscope's plus the differences the two
models name (what vLLM's analytic model counts beyond kvscope's), from a second model of
the same geometry: so a step agrees, and one counted 10 % over does not. The app runs on
the fake engine, its steps' counts replaced by those.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from test_tui_roofline import OUTPUT, PROMPT, _prompt_and_decode
from textual.widgets import Static
from tui_helpers import WIDE, make_app, settle

from engine.events import StepPerf, StepSample
from engine.fake import FakeEngine
from roofline.hardware import shipped_geometry
from roofline.step_perf import RESIDUAL_TOLERANCE, StepModel
from tui.telemetry.buffers import Telemetry
from tui.telemetry.perf_agreement import PerfAgreement, step_model_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import ModelCard

MODEL = "smollm2-135m-instruct"


def _model() -> StepModel:
    return StepModel(shipped_geometry(MODEL))


class VllmLikeFake(FakeEngine):
    """The fake, each step's count replaced by what vLLM's model would count of it
    (kvscope's plus the named differences), `over` times that at step `off_at`."""

    def __init__(self, *, off_at: int | None = None, over: float = 1.1) -> None:
        super().__init__()
        self._counter = _model()
        self._off_at = off_at
        self._over = over

    def add_step_listener(self, listener: Callable[[StepSample], None]) -> Callable[[], None]:
        def counted(sample: StepSample) -> None:
            listener(self.count(sample))

        return super().add_step_listener(counted)

    def count(self, sample: StepSample) -> StepSample:
        modelled = self._counter.observe(sample)
        if modelled is None:
            return sample
        ours, named = modelled.perf, modelled.vllm_only
        scale = self._over if sample.step == self._off_at else 1.0
        perf = StepPerf(
            (ours.flops + named.flops) * scale,
            ours.read_bytes + named.read_bytes,
            ours.write_bytes + named.write_bytes,
            "vllm",
        )
        return dataclasses.replace(sample, perf=perf)


async def _with_kvscopes_model(engine: FakeEngine, size: tuple[int, int] = WIDE) -> str:
    """The roofline box's check line after a 512-token prompt and its decode, with
    kvscope's model of SmolLM2-135M set as the engine's (a fake has none of its own)."""
    app = make_app(engine=engine)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await app.workers.wait_for_complete()
        app.telemetry.perf_agreement = PerfAgreement(_model())
        await _prompt_and_decode(pilot)
        check = app.main_screen.engine_panel.query_one("#roofline-check", Static)
        assert check.display == bool(str(check.render()))
        return str(check.render()) if check.display else ""


async def test_the_box_says_vllms_count_and_kvscopes_agree() -> None:
    line = await _with_kvscopes_model(VllmLikeFake())
    # 1 prefill step (its first token with it) and 15 decode steps, each checked.
    assert line == f"vLLM's count and kvscope's agree within 2 % ({OUTPUT} steps)"
    assert RESIDUAL_TOLERANCE == 0.02


async def test_the_box_names_a_step_that_disagrees() -> None:
    line = await _with_kvscopes_model(VllmLikeFake(off_at=3))
    assert line.startswith(
        f"vLLM's count and kvscope's disagree on 1 of {OUTPUT} steps (past 2 %): "
    )
    assert line.endswith("first step 3, vLLM's flops +10.0 %")


async def test_a_fake_gets_no_line_and_no_model() -> None:
    engine = FakeEngine()
    assert step_model_for(engine.start()) == (None, "")
    assert await _with_kvscopes_model_absent(engine) == ""


async def _with_kvscopes_model_absent(engine: FakeEngine) -> str:
    app = make_app(engine=engine)
    async with app.run_test(size=WIDE) as pilot:
        await _prompt_and_decode(pilot)
        assert app.telemetry.perf_agreement.model is None
        check = app.main_screen.engine_panel.query_one("#roofline-check", Static)
        return str(check.render()) if check.display else ""


def _card(**changes: object) -> ModelCard:
    card = FakeEngine().start()
    return dataclasses.replace(card, **changes)  # type: ignore[arg-type]


def test_which_engines_get_kvscopes_model() -> None:
    model, missing = step_model_for(_card(device="cpu", path=MODEL, dtype="bfloat16"))
    assert model is not None and missing == ""
    assert model.geom.dtype_bytes == 2
    assert step_model_for(_card(device="cpu", path=MODEL), remote=True) == (None, "")
    model, missing = step_model_for(_card(device="cuda", path=MODEL, parallel="TP 2 x PP 1"))
    assert model is None and "per GPU of TP 2 x PP 1" in missing
    model, missing = step_model_for(_card(device="cpu", path="/nowhere/at-all", name="x"))
    assert model is None and missing.startswith("kvscope has no roofline model of x: ")
    assert PerfAgreement(None, missing).words() == f"kvscope's count: {missing}"


def test_the_tallies_and_a_rewind() -> None:
    engine = VllmLikeFake(off_at=2)
    tel = Telemetry()
    tel.perf_agreement = PerfAgreement(_model())
    prompt = engine.synthetic_prompt(PROMPT)
    samples = _fake_steps(engine, prompt)
    for s in samples:
        tel.add_sample(s)
    agreement = tel.perf_agreement
    assert agreement.steps == OUTPUT and agreement.agreed == OUTPUT - 1
    assert agreement.first is not None and agreement.first.step == 2
    assert agreement.worst <= RESIDUAL_TOLERANCE
    tel.clear_plots()  # F9: the tallies go, the model stays
    assert agreement.steps == 0 and agreement.first is None and agreement.words() == ""
    assert agreement.model is not None


def _fake_steps(engine: VllmLikeFake, prompt: tuple[int, ...]) -> list[StepSample]:
    import asyncio

    from engine.events import GenerationRequest, SamplingSettings

    engine.start()
    samples: list[StepSample] = []
    engine.add_step_listener(samples.append)
    request = GenerationRequest(
        "r1",
        prompt_token_ids=prompt,
        sampling=SamplingSettings(max_tokens=OUTPUT, ignore_eos=True),
    )

    async def run() -> None:
        async for _ in engine.stream(request):
            pass
        engine.shutdown()

    asyncio.run(run())
    return samples


class CpuCardFake(VllmLikeFake):
    """The vLLM-like fake, whose card says it runs SmolLM2-135M on a CPU, as vLLM's does."""

    @property
    def card(self) -> ModelCard | None:
        card = super().card
        return None if card is None else dataclasses.replace(card, device="cpu", path=MODEL)

    def start(self, progress: object = None) -> ModelCard:
        super().start()
        card = self.card
        assert card is not None
        return card


async def test_the_screen_builds_kvscopes_model_for_the_engines_card() -> None:
    app = make_app(engine=CpuCardFake())
    async with app.run_test(size=WIDE) as pilot:
        await _prompt_and_decode(pilot)
        await app.workers.wait_for_complete()
        agreement = app.telemetry.perf_agreement
        assert agreement.model is not None
        assert agreement.model.geom.name == shipped_geometry(MODEL).name
