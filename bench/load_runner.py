"""Load on any Engine: N users (closed loop) or R requests/s (open loop), one point per level.

A point runs for a number of prompts or a duration, after an unmeasured warm-up; how it
sends is `bench.load_loops`, what it sends `bench.load_prompts`, and what the engine saw
while it ran `bench.step_view`. Here each point is planned, run and summed up as a
`LoadPoint`: latencies, throughput, goodput, schedule error and notes in words.

Nothing here prints: progress goes to `on_progress`, each finished point to `on_point`,
so the CLI and the playground drive the same runner. Times are on the engine's clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from bench.arrivals import ArrivalPattern, schedule_count, schedule_duration
from bench.goodput import RequestSlo, goodput
from bench.load_loops import PointInFlight, closed_loop, open_loop
from bench.load_prompts import PromptMaker, lengths_range
from bench.load_result import (
    LoadConfig,
    LoadPoint,
    LoadResult,
    Profile,
    StepView,
    failure_words,
    level_label,
)
from bench.records import request_record
from bench.step_view import StepTaps, step_view
from engine.clock import Clock, RealClock
from engine.errors import BadOption, KvscopeError
from engine.request_book import check_prompt_length, prompt_fits
from engine.stats import mean, percentile
from roofline.point_perf import point_roofline

if TYPE_CHECKING:
    from bench.load_loops import SentRequest
    from engine.protocol import Engine

MAX_CONCURRENCY = 4096
MAX_RATE = 10_000.0  # requests/s
MAX_DURATION_S = 24 * 3600.0
MAX_NUM_PROMPTS = 1_000_000

Ceiling = Callable[[int], float]
"""The roofline's output tokens/s at a decode batch of b requests (the point's context)."""


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """One point's load: `concurrency` users, or `rate` requests/s."""

    profile: Profile
    concurrency: int | None = None
    rate: float | None = None

    @classmethod
    def users(cls, n: int, profile: Profile = "concurrency") -> LoadLevel:
        return cls(profile, concurrency=n)

    @classmethod
    def per_second(cls, rate: float, profile: Profile = "rate") -> LoadLevel:
        return cls(profile, rate=rate)


@dataclass(frozen=True, slots=True)
class LoadTick:
    """Where a load run stands, for a progress bar."""

    point: int  # 1-based
    points: int | None  # None while a search decides how many
    label: str
    sent: int
    done: int
    planned: int | None  # requests this point plans; None for a closed loop by duration
    elapsed_s: float
    duration_s: float | None


ProgressFn = Callable[[LoadTick], None]


def levels_of(config: LoadConfig) -> list[LoadLevel]:
    if config.mode == "concurrency":
        return [LoadLevel.users(int(n)) for n in config.levels]
    return [LoadLevel.per_second(r) for r in config.levels]


def validate(config: LoadConfig) -> None:
    """Bounds that no machine can use, refused before any work, in one plain line."""
    if not config.levels:
        raise BadOption(f"--{config.mode.replace('rate', 'request-rate')}", "the list is empty")
    for v in config.levels:
        if config.mode == "concurrency":
            if v != int(v) or v < 1:
                raise BadOption("--concurrency", f"{v:g} is not a positive whole number")
            if v > MAX_CONCURRENCY:
                raise BadOption(
                    "--concurrency", f"{int(v):,} users is past the limit of {MAX_CONCURRENCY:,}"
                )
        else:
            if math.isnan(v):
                raise BadOption("--request-rate", "NaN is not a number of requests/s")
            if v <= 0:
                raise BadOption("--request-rate", f"{v:g} is not a positive rate")
            if math.isfinite(v) and v > MAX_RATE:
                raise BadOption(
                    "--request-rate",
                    f"{v:,g} requests/s is past the limit of {MAX_RATE:,g} (inf sends all at once)",
                )
    if config.duration_s is not None and config.mode == "rate" and math.inf in config.levels:
        raise BadOption(
            "--duration", "a rate of inf sends everything at once: give --num-prompts instead"
        )
    if config.duration_s is not None:
        if config.duration_s <= 0:
            raise BadOption("--duration", f"{config.duration_s:g} s: it must be more than 0 s")
        if config.duration_s > MAX_DURATION_S:
            raise BadOption(
                "--duration",
                f"{config.duration_s:,g} s is past the limit of {MAX_DURATION_S:,.0f} s (a day)",
            )
    if config.num_prompts is not None and not (1 <= config.num_prompts <= MAX_NUM_PROMPTS):
        raise BadOption(
            "--num-prompts", f"{config.num_prompts:,} is not between 1 and {MAX_NUM_PROMPTS:,}"
        )
    _check_reachable(config)
    if not (0 <= config.range_ratio < 1):
        raise BadOption("--range-ratio", f"{config.range_ratio:g} is not in [0, 1)")
    if config.prompt_len < 1 or config.output_len < 1:
        raise BadOption("--prompt-lens", "prompt and output lengths must be positive")
    low = lengths_range(config.prompt_len, config.range_ratio)[0]
    if config.shared_prefix < 0 or (config.shared_prefix and config.shared_prefix >= low):
        raise BadOption(
            "--shared-prefix",
            f"{config.shared_prefix:,} tokens must be fewer than the shortest prompt ({low:,})",
        )
    if config.warmup < 0:
        raise BadOption("--warmup", f"{config.warmup} is negative")
    ArrivalPattern(1.0, config.arrival, config.burstiness).validate()


def _check_reachable(config: LoadConfig) -> None:
    """Levels a point could never reach, refused: N users with fewer than N requests never
    have N in flight at once, and a rate whose requests would come after the point's end
    (or after a day) leaves the run waiting with nothing to show."""
    n = config.num_prompts
    if config.mode == "concurrency":
        users = int(max(config.levels))
        if n is not None and users > n:
            # Named as the count's flag: the playground's form labels it "requests/level".
            raise BadOption(
                "--num-prompts",
                f"{n:,} requests a level cannot keep {users:,} users busy at once: give at "
                f"least {users:,}, or fewer users",
            )
        return
    for rate in config.levels:
        if math.isinf(rate):
            continue
        if config.duration_s is not None:
            if rate * config.duration_s < 1:
                raise BadOption(
                    "--request-rate",
                    f"at {rate:g} requests/s one request comes every {_secs(1 / rate)} s on "
                    f"average, longer than the point (--duration {config.duration_s:g} s): give "
                    f"at least {1 / config.duration_s:g} requests/s or a longer --duration",
                )
            continue
        count = planned_count(config, LoadLevel.per_second(rate))
        span = count / rate
        if span > MAX_DURATION_S:
            raise BadOption(
                "--request-rate",
                f"{count:,} requests at {rate:g} requests/s take about {_secs(span)} s to send, "
                f"past the limit of {MAX_DURATION_S:,.0f} s (a day): give at least "
                f"{count / MAX_DURATION_S:.2g} requests/s, or fewer requests",
            )


def _secs(s: float) -> str:
    """Seconds for a message: 100, 12,500, or 8e+300 when there are too many digits."""
    return f"{s:,.3g}" if s < 1000 else (f"{s:,.0f}" if s < 1e12 else f"{s:.2g}")


def planned_count(config: LoadConfig, level: LoadLevel) -> int:
    """Requests a point sends when neither --num-prompts nor --duration says: enough for
    every user several times over, or four seconds' worth of the rate."""
    if config.num_prompts is not None:
        return config.num_prompts
    if level.concurrency is not None:
        return max(8, 4 * level.concurrency)
    rate = level.rate or 1.0
    return 16 if math.isinf(rate) else max(8, min(1000, math.ceil(4 * rate)))


async def run_load(
    engine: Engine,
    config: LoadConfig,
    *,
    levels: list[LoadLevel] | None = None,
    on_point: Callable[[LoadPoint], None] | None = None,
    on_progress: ProgressFn | None = None,
    ceiling: Ceiling | None = None,
    clock: Clock | None = None,
    result: LoadResult | None = None,
) -> LoadResult:
    """Measure each level in turn (default: the config's), after the warm-up."""
    validate(config)
    card = engine.card
    result = result if result is not None else LoadResult(config)
    result.model = asdict(card) if card else None
    todo = levels if levels is not None else levels_of(config)
    runner = LoadRunner(engine, config, on_progress=on_progress, ceiling=ceiling, clock=clock)
    await runner.warm_up()
    for level in todo:
        point = await runner.measure(level, points=len(todo))
        result.points.append(point)
        if on_point:
            on_point(point)
    return result


class LoadRunner:
    """Measures load points on one engine; `run_load`, `--sweep` and `--find-max` use it."""

    def __init__(
        self,
        engine: Engine,
        config: LoadConfig,
        *,
        on_progress: ProgressFn | None = None,
        ceiling: Ceiling | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.engine, self.config = engine, config
        self.on_progress = on_progress
        self.ceiling = ceiling
        self.clock: Clock = clock or engine.features.clock or RealClock()
        self.index = 0

    async def warm_up(self) -> None:
        """The first requests of a fresh engine pay one-off costs: a few, unmeasured."""
        if not self.config.warmup:
            return
        maker = PromptMaker(self.engine, replace(self.config, shared_prefix=0), 0)
        card = self.engine.card
        for i in range(self.config.warmup):
            request = maker.make(i, "-warmup")
            ids = request.prompt_token_ids or ()
            if card is not None and not prompt_fits(len(ids), card.max_model_len):
                return  # the point itself will say so
            short = replace(request, sampling=replace(request.sampling, max_tokens=4))
            try:
                async for _ in self.engine.stream(short):
                    pass
            except KvscopeError:
                return

    async def measure(self, level: LoadLevel, *, points: int | None = None) -> LoadPoint:
        self.index += 1
        c = self.config
        maker = PromptMaker(self.engine, c, self.index)
        label = level_label(level.profile, level.concurrency, level.rate)
        total = points

        def tick(p: PointInFlight) -> None:
            if self.on_progress:
                self.on_progress(
                    LoadTick(
                        self.index,
                        total,
                        label,
                        len(p.sent),
                        p.done,
                        p.planned,
                        p.elapsed(),
                        p.duration_s,
                    )
                )

        card = self.engine.card
        if card is not None:
            longest = lengths_range(c.prompt_len, c.range_ratio)[1]
            try:
                check_prompt_length(longest, card.max_model_len)
            except KvscopeError as exc:
                return _failed(level, exc.plain())
        taps = StepTaps()
        try:
            if level.rate is not None:
                plan = self._plan(level.rate)
                requests = [maker.make(i) for i in range(len(plan))]
                taps.attach(self.engine)
                point = PointInFlight(self.engine, self.clock, level.rate, tick)
                point.planned, point.duration_s = len(plan), c.duration_s
                await open_loop(point, requests, plan)
            else:
                users = level.concurrency or 1
                count = None if c.duration_s is not None else planned_count(c, level)
                ready = [maker.make(i) for i in range(count)] if count is not None else []
                taps.attach(self.engine)
                point = PointInFlight(self.engine, self.clock, level.rate, tick)
                point.planned, point.duration_s = count, c.duration_s
                await closed_loop(point, users, ready, count, maker, c.duration_s)
            point.end()
            await taps.last_window()  # up to 2 s attached: after the point's clock stops
        finally:
            taps.detach()
        return self._summarize(level, point, taps)

    def _plan(self, rate: float) -> list[float]:
        c = self.config
        pattern = ArrivalPattern(rate, c.arrival, c.burstiness, seed=c.seed * 7919 + self.index)
        if c.duration_s is not None and math.isfinite(rate):
            plan = schedule_duration(pattern, c.duration_s)
            return plan or [0.0]
        return schedule_count(pattern, planned_count(c, LoadLevel.per_second(rate)))

    def _summarize(self, level: LoadLevel, p: PointInFlight, taps: StepTaps) -> LoadPoint:
        c = self.config
        done = [s for s in p.sent if s.finished is not None and s.finished.reason != "abort"]
        aborted = sum(1 for s in p.sent if s.finished is not None and s.finished.reason == "abort")
        failed = [s for s in p.sent if s.finished is None and s.error is not None]
        aborted += sum(1 for s in p.sent if s.finished is None and s.error is None)
        fins = [s.finished for s in done if s.finished is not None]
        ends = [s.sent_s + f.e2e_s for s in done if (f := s.finished) is not None]
        ends += [s.sent_s + s.failed_s for s in failed if s.failed_s is not None]
        # Every request in the order sent, failed ones too: a failure is a result.
        records = tuple(_record(s) for s in p.sent if _kept(s))
        causes = Counter(s.cause or "refused" for s in failed)
        duration = max([p.length(), *ends]) if p.stop_reason is None else p.length()
        if not fins:
            why = failed[0].error if failed else (p.stop_reason or "no request completed")
            failed_point = _failed(level, why or "no request completed", aborted=aborted)
            if failed:
                # The sentence says how many and why; the first error says it in full.
                why = f"{failure_words(len(failed), len(failed) + aborted, causes)}: {why}"
            return replace(
                failed_point,
                error=why,
                failed=len(failed),
                stopped_early=p.stop_reason,
                requests=records,
                duration_s=duration,
                max_concurrent_requests=p.peak,
                **_missed_everything(c.goodput),
            )
        ttft = [f.ttft_s for f in fins if f.ttft_s is not None]
        slos = [RequestSlo.of(f.ttft_s, f.e2e_s, f.output_tokens) for f in fins]
        tpot = [r.tpot_s for r, f in zip(slos, fins, strict=True) if f.output_tokens > 1]
        itl = [x for f in fins for x in f.itl_s]
        e2el = [f.e2e_s for f in fins]
        total_in = sum(f.prompt_tokens for f in fins)
        total_out = sum(f.output_tokens for f in fins)
        figures: dict[str, Any] = {}
        for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
            figures[f"mean_{name}_ms"] = mean(values) * 1e3
            for stat, pct in (("median", 50), ("p90", 90), ("p99", 99)):
                figures[f"{stat}_{name}_ms"] = percentile(values, pct) * 1e3
        if c.goodput:
            # A failed request met no objective; nor did one aborted unfinished.
            g = goodput(slos, c.goodput, duration, missed=len(failed) + aborted)
            figures["request_goodput"] = g.request_goodput
            figures["slo_all_within"] = g.all_within
            for name, share in g.within.items():
                figures[f"slo_{name}_within"] = share
        errors = [
            (s.sent_s - s.planned_s) * 1e3 for s in p.sent if s.planned_s is not None
        ]  # fmt: skip
        if errors:
            figures["schedule_error_p50_ms"] = percentile(errors, 50)
            figures["schedule_error_p99_ms"] = percentile(errors, 99)
        known = [f.cached_prompt_tokens for f in fins if f.cached_prompt_tokens is not None]
        steps, queued = step_view(taps, p.start, done)
        roofline = point_roofline(
            [s for s in taps.steps if s.started_at >= p.start - 1e-9],
            [s for s in taps.scrapes if s.time_s >= p.start],
        )
        notes = _notes(p, steps, queued, len(done))
        words = None
        if failed:
            # Said first: every figure below describes the requests that survived.
            words = failure_words(len(failed), len(fins) + len(failed) + aborted, causes)
            notes[:0] = [
                f"{words}; the figures are the {len(fins)} completed",
                *_first_errors(failed),
            ]
        if known and sum(known) > 0:
            share = sum(known) / max(total_in, 1)
            notes.append(
                f"the prefix cache served {share:.0%} of the prompt tokens: "
                "prefills look cheaper than they are"
            )
        batch = level.concurrency or (round(steps.mean_running) if steps else None)
        roof = self.ceiling(max(batch, 1)) if self.ceiling and batch else None
        return LoadPoint(
            profile=level.profile,
            max_concurrency=level.concurrency,
            request_rate=level.rate,
            burstiness=c.burstiness if level.rate is not None else None,
            ok=not failed,
            error=words,
            completed=len(fins),
            failed=len(failed),
            aborted=aborted,
            total_input_tokens=total_in,
            total_output_tokens=total_out,
            duration_s=duration,
            request_throughput=len(fins) / duration if duration > 0 else 0.0,
            output_throughput=total_out / duration if duration > 0 else 0.0,
            total_token_throughput=(total_in + total_out) / duration if duration > 0 else 0.0,
            max_concurrent_requests=p.peak,
            queued_requests=queued,
            cached_prompt_tokens=sum(known) if known else None,
            roofline_output_throughput=roof,
            stopped_early=p.stop_reason,
            notes=tuple(notes),
            steps=steps,
            requests=records,
            roofline=roofline,
            **figures,
        )


def _failed(level: LoadLevel, why: str, aborted: int = 0) -> LoadPoint:
    return LoadPoint(
        profile=level.profile,
        max_concurrency=level.concurrency,
        request_rate=level.rate,
        burstiness=None,
        ok=False,
        error=why,
        aborted=aborted,
    )


def _missed_everything(slo_ms: dict[str, float]) -> dict[str, Any]:
    """Goodput of a point where no request completed: nothing met any objective."""
    if not slo_ms:
        return {}
    shares = {f"slo_{name}_within": 0.0 for name in slo_ms}
    return {"request_goodput": 0.0, "slo_all_within": 0.0, **shares}


def _record(s: SentRequest) -> dict[str, Any]:
    out = request_record(s.finished) if s.finished is not None else _failed_record(s)
    out["sent_s"] = s.sent_s
    if s.planned_s is not None:
        out["planned_s"] = s.planned_s
        out["schedule_error_s"] = s.sent_s - s.planned_s
    if s.user is not None:
        out["user"] = s.user
    return out


def _first_errors(failed: list[SentRequest]) -> list[str]:
    """The first error of each cause, in words: "replica down: No vLLM server answers at
    ..." says which server is down, "HTTP 500: ..." what it said."""
    first: dict[str, str] = {}
    for s in failed:
        first.setdefault(s.cause or "refused", s.error or "no reason given")
    return [f"{cause}: {error}" for cause, error in first.items()]


def _kept(s: SentRequest) -> bool:
    """Whether a request is in the point's `requests`: completed or failed (one aborted
    when the point stopped early was the point's own doing)."""
    if s.finished is not None:
        return s.finished.reason != "abort"
    return s.error is not None


def _failed_record(s: SentRequest) -> dict[str, Any]:
    """A failed request as far as it got: the tokens and their times before the failure,
    its cause ("HTTP 500", "cut", "timeout", "replica down", ...) and the error's words."""
    gaps = [b - a for a, b in zip(s.token_s, s.token_s[1:], strict=False)]
    ids = s.request.prompt_token_ids
    return {
        "request_id": s.request.request_id,
        "prompt_tokens": len(ids) if ids is not None else None,
        "output_tokens": s.tokens,  # received before the failure
        "finish_reason": None,
        "failure": s.cause,
        "error": s.error,
        "ttft_s": s.token_s[0] if s.token_s else None,
        "itl_s": gaps,
        "e2e_s": None,  # it never ended: failed_after_s says when it broke
        "failed_after_s": s.failed_s,
    }


def _notes(p: PointInFlight, steps: StepView | None, queued: int, completed: int) -> list[str]:
    notes = []
    if p.stop_reason:
        notes.append(f"stopped early after {len(p.sent)} requests: {p.stop_reason}")
    if queued:
        where = f", up to {steps.max_waiting} waiting at once" if steps else ""
        notes.append(f"{queued} of {completed} requests waited in the engine's queue{where}")
    elif steps is not None and steps.max_waiting and steps.source == "scrapes":
        notes.append(f"up to {steps.max_waiting} requests waited in the server's queue")
    if steps is not None and steps.preemptions:
        notes.append(f"{steps.preemptions} preemption(s): the KV pool ran out of blocks")
    return notes
