"""The prompt-length sweep of the reference article, on any Engine.

Each run sends `concurrency` requests of an exact-length synthetic prompt that ignore EOS,
so every run generates the same number of tokens. Field names follow `vllm bench`
(`mean_ttft_ms`, `median_itl_ms`, ...) so results can be read side by side.
"""

from __future__ import annotations

import asyncio
import csv
import io
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from bench.records import request_record
from engine.errors import BadOption, KvscopeError, PromptTooLong
from engine.events import GenerationRequest, RequestFinished, SamplingSettings
from engine.stats import summarize_ms

if TYPE_CHECKING:
    from pathlib import Path

    from engine.protocol import Engine

# Predicted floors for a prompt length: (ttft_floor_s, itl_floor_s).
FloorFn = Callable[[int], tuple[float, float]]

CSV_FIELDS = (
    "prompt_len",
    "ok",
    "error",
    "completed",
    "total_output_tokens",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "output_throughput",
    "request_throughput",
    "duration_s",
    "ttft_floor_ms",
    "itl_floor_ms",
    "ttft_pct_of_floor",
    "itl_pct_of_floor",
)


@dataclass(frozen=True)
class SweepConfig:
    prompt_lens: tuple[int, ...] = (512, 1024, 2048, 4096)
    output_len: int = 128
    runs: int = 3
    warmup: int = 1
    concurrency: int = 1

    def validate(self, max_model_len: int | None = None) -> None:
        """Flags that cannot work at all; a length past the context wall is not one of
        them: it is measured (and fails) like any other point."""
        if not self.prompt_lens:
            raise BadOption("--prompt-lens", "the list is empty")
        bad = [n for n in self.prompt_lens if n <= 0]
        if bad:
            raise BadOption("--prompt-lens", f"{bad[0]} is not a positive length")
        if self.output_len <= 0:
            raise BadOption("--output-len", f"{self.output_len} is not a positive count")
        if self.runs <= 0:
            raise BadOption("--runs", f"{self.runs} is not a positive count")
        if self.warmup < 0:
            raise BadOption("--warmup", f"{self.warmup} is negative")
        if self.concurrency <= 0:
            raise BadOption("--concurrency", f"{self.concurrency} is not a positive count")


@dataclass(frozen=True)
class SweepMetrics:
    """One prompt length's figures, with `vllm bench`'s field names (milliseconds)."""

    completed: int = 0
    total_output_tokens: int = 0
    mean_ttft_ms: float = 0.0
    median_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    mean_tpot_ms: float = 0.0
    median_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    mean_itl_ms: float = 0.0
    median_itl_ms: float = 0.0
    p99_itl_ms: float = 0.0
    mean_e2el_ms: float = 0.0
    median_e2el_ms: float = 0.0
    p99_e2el_ms: float = 0.0
    output_throughput: float = 0.0
    request_throughput: float = 0.0
    duration_s: float = 0.0
    # The roofline's floors for this length, and how close the measurement came to them;
    # None without a hardware profile.
    ttft_floor_ms: float | None = None
    itl_floor_ms: float | None = None
    ttft_pct_of_floor: float | None = None
    itl_pct_of_floor: float | None = None

    def value(self, name: str) -> float | None:
        """A figure by its field name (tables and charts pick columns by name)."""
        v = getattr(self, name, None)
        return None if v is None else float(v)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepMetrics:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v not in ("", None)})


@dataclass(frozen=True)
class SweepPoint:
    prompt_len: int
    ok: bool
    error: str | None
    metrics: SweepMetrics | None = None  # None when the length failed
    requests: tuple[dict[str, Any], ...] = ()

    def value(self, name: str) -> float | None:
        return self.metrics.value(name) if self.metrics is not None else None

    def row(self) -> dict[str, Any]:
        return {
            "prompt_len": self.prompt_len,
            "ok": self.ok,
            "error": self.error or "",
            **(self.metrics.as_dict() if self.metrics is not None else {}),
        }


@dataclass
class SweepResult:
    config: SweepConfig
    points: list[SweepPoint] = field(default_factory=list)
    model: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    # False while the sweep still runs: a file written point by point says so, and a
    # sweep stopped half-way leaves a file that says it is partial.
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "complete": self.complete,
            "model": self.model,
            "hardware": self.hardware,
            "points": [{**p.row(), "requests": list(p.requests)} for p in self.points],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> SweepResult:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Any, where: str = "the file") -> SweepResult:
        """The result `to_dict` wrote; a ValueError names the first key that is missing
        or holds the wrong kind of value (`where` says whose keys, in that sentence)."""
        cfg = _key(data, "config", where, dict)
        in_cfg = f'{where}\'s "config"'

        def whole(key: str) -> int:
            return _whole(_key(cfg, key, in_cfg), f'{in_cfg} has "{key}"')

        config = SweepConfig(
            prompt_lens=tuple(
                _whole(n, f'{in_cfg} has a "prompt_lens" entry')
                for n in _key(cfg, "prompt_lens", in_cfg, list)
            ),
            output_len=whole("output_len"),
            runs=whole("runs"),
            warmup=whole("warmup"),
            concurrency=whole("concurrency"),
        )
        points = []
        for n, p in enumerate(_key(data, "points", where, list), 1):
            at = f"point {n} of {where}"
            ok = _key(p, "ok", at, bool)
            if ok:
                for name in _METRIC_NAMES & p.keys():
                    value = p[name]
                    if value not in ("", None) and not _is_number(value):
                        raise ValueError(f'{at} has "{name}": {value!r}, not a number')
            points.append(
                SweepPoint(
                    _whole(_key(p, "prompt_len", at), f'{at} has "prompt_len"'),
                    ok,
                    p.get("error") or None,
                    SweepMetrics.from_dict(p) if ok else None,
                    tuple(p.get("requests", ())),
                )
            )
        model, hardware = data.get("model"), data.get("hardware")
        return cls(
            config,
            points,
            model if isinstance(model, dict) else None,
            hardware if isinstance(hardware, dict) else None,
            bool(data.get("complete", True)),
        )

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for p in self.points:
            writer.writerow(p.row())
        return buf.getvalue()

    @staticmethod
    def rows_from_csv(text: str) -> list[dict[str, Any]]:
        rows = []
        for raw in csv.DictReader(io.StringIO(text)):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if k == "prompt_len":
                    row[k] = int(v)
                elif k == "ok":
                    row[k] = v == "True"
                elif k == "error":
                    row[k] = v or None
                else:
                    row[k] = float(v) if v != "" else None
            rows.append(row)
        return rows


_METRIC_NAMES = frozenset(f.name for f in fields(SweepMetrics))


def _key(data: Any, key: str, where: str, kind: type | None = None) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where} is not a JSON object")
    if key not in data:
        raise ValueError(f'{where} has no "{key}" key')
    value = data[key]
    if kind is not None and not isinstance(value, kind):
        what = {dict: "an object", list: "a list", bool: "true or false"}.get(kind, kind.__name__)
        raise ValueError(f'{where} has "{key}": {value!r}, not {what}')
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: Any, what: str) -> int:
    """`value` as a whole number; `what` says where it was ('point 2 has "prompt_len"')."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: {value!r}, not a whole number")
    return value


@dataclass(frozen=True)
class SavedSweep:
    """One engine config's sweep, read back from a file."""

    label: str
    """"" for a plain sweep file; "A" or "B" for a `bench --compare` file."""
    result: SweepResult
    flags: str | None = None
    """The config's engine flags, from a compare file ("" for the defaults)."""


class SweepFileError(KvscopeError):
    """A saved sweep that cannot be read back: the file, and why in plain words."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def plain(self) -> str:
        return f"Cannot load {self.path}: {self.why}."


def saved_sweeps_from_json(text: str) -> list[SavedSweep]:
    """The sweeps in what `bench --json` (or the sweep screen's export) wrote: one
    SweepResult, or `bench --compare`'s {"compare": {"A": {"flags": ..., ...}, "B": ...}}.

    Raises ValueError in words: not JSON, or the key that is missing.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"it is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    try:
        if isinstance(data, dict) and "compare" in data:
            configs = _key(data, "compare", "the file", dict)
            if not configs:
                raise ValueError('the file\'s "compare" holds no config')
            saved = []
            for label, body in configs.items():
                where = f"config {label}"
                result = SweepResult.from_dict(body, where)
                flags = body.get("flags")
                saved.append(
                    SavedSweep(str(label), result, flags if isinstance(flags, str) else "")
                )
            return saved
        return [SavedSweep("", SweepResult.from_dict(data))]
    except ValueError as exc:
        raise ValueError(f"it is not a sweep result: {exc}") from None


def load_saved_sweeps(path: Path) -> list[SavedSweep]:
    """Read a saved sweep (see `saved_sweeps_from_json`) to compare against; a file
    without one measured point has nothing to compare, and says so.

    Raises SweepFileError, whose `plain()` is one sentence naming the file.
    """
    name = str(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise SweepFileError(name, "there is no such file") from None
    except IsADirectoryError:
        raise SweepFileError(name, "it is a folder, not a file") from None
    except UnicodeDecodeError:
        raise SweepFileError(name, "it is not JSON (not even text)") from None
    except OSError as exc:
        raise SweepFileError(name, exc.strerror or str(exc)) from None
    try:
        saved = saved_sweeps_from_json(text)
    except ValueError as exc:
        raise SweepFileError(name, str(exc)) from None
    points = [p for s in saved for p in s.result.points]
    if not any(p.ok and p.metrics is not None for p in points):
        if not points:
            why = "it holds no measured point (its list of points is empty)"
        elif len(points) == 1:
            why = "it holds no measured point (its one prompt length failed)"
        else:
            why = f"it holds no measured point (all {len(points)} prompt lengths failed)"
        raise SweepFileError(name, why)
    return saved


def make_floors(model_path: str, hardware: str, output_len: int) -> tuple[FloorFn, dict[str, Any]]:
    """Roofline floors for the running model on `hardware` ("cpu" is this machine)."""
    from roofline.hardware import load_geometry, load_profile
    from roofline.model import itl_floor_s, ttft_floor_s

    geom = load_geometry(model_path)
    hw = load_profile(hardware, option="--hardware")

    def floors(prompt_len: int) -> tuple[float, float]:
        # ITL floor at the middle of the output, where the median token sits.
        return ttft_floor_s(geom, hw, prompt_len), itl_floor_s(
            geom, hw, prompt_len + output_len // 2
        )

    return floors, {**hw.to_dict(), "model_geometry": geom.to_dict()}


def floors_for_card(card: Any, output_len: int) -> FloorFn | None:
    """This machine's floors for a CPU engine's model, or None where none can be had
    (a GPU, whose profile the user must name; a model whose config is not local)."""
    if card is None or card.device != "cpu":
        return None
    try:
        return make_floors(card.path, "cpu", output_len)[0]
    except KvscopeError:
        return None


def check_prompt_fits(prompt_len: int, max_model_len: int) -> None:
    """vLLM's rule: a prompt needs room for one output token, so max_model_len itself
    is already too long."""
    if prompt_len >= max_model_len:
        raise PromptTooLong(prompt_len, max_model_len)


_ids = itertools.count()


def _make_request(engine: Engine, prompt_len: int, output_len: int) -> GenerationRequest:
    seed = next(_ids)
    # A new seed per request: no two prompts share a prefix, so prefix caching cannot
    # make a prefill look cheaper than it is.
    return GenerationRequest(
        f"bench-{prompt_len}-{seed}",
        prompt_token_ids=engine.synthetic_prompt(prompt_len, seed=1_000_003 * seed + prompt_len),
        sampling=SamplingSettings(max_tokens=output_len, ignore_eos=True),
    )


async def _one_request(engine: Engine, prompt_len: int, output_len: int) -> RequestFinished:
    return await _send(engine, _make_request(engine, prompt_len, output_len))


async def _send_together(
    engine: Engine, requests: list[GenerationRequest]
) -> list[RequestFinished]:
    """Send every request in one go: all prompts are built first, so for --concurrency N
    all N are in the engine's queue before the first step that serves them (building one
    while the engine already steps on another would shorten the first one's TTFT)."""
    return list(await asyncio.gather(*(_send(engine, r) for r in requests)))


async def _send(engine: Engine, request: GenerationRequest) -> RequestFinished:
    finished = None
    async for event in engine.stream(request):
        if isinstance(event, RequestFinished):
            finished = event
    assert finished is not None
    return finished


def _pct(floor_ms: float | None, measured_ms: float) -> float | None:
    return 100 * floor_ms / measured_ms if floor_ms is not None and measured_ms > 0 else None


def summarize(
    prompt_len: int, done: list[RequestFinished], duration_s: float, floors: FloorFn | None
) -> SweepPoint:
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    itl = [x for r in done for x in r.itl_s]
    tpot = [
        (r.e2e_s - (r.ttft_s or 0.0)) / (r.output_tokens - 1) for r in done if r.output_tokens > 1
    ]
    e2el = [r.e2e_s for r in done]
    total_out = sum(r.output_tokens for r in done)
    ttft_floor = itl_floor = None
    if floors is not None:
        floor_ttft_s, floor_itl_s = floors(prompt_len)
        ttft_floor, itl_floor = floor_ttft_s * 1000, floor_itl_s * 1000
    t, tp, i, e = (
        summarize_ms(k, v)
        for k, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el))
    )
    metrics = SweepMetrics(
        completed=len(done),
        total_output_tokens=total_out,
        mean_ttft_ms=t["mean_ttft_ms"],
        median_ttft_ms=t["median_ttft_ms"],
        p99_ttft_ms=t["p99_ttft_ms"],
        mean_tpot_ms=tp["mean_tpot_ms"],
        median_tpot_ms=tp["median_tpot_ms"],
        p99_tpot_ms=tp["p99_tpot_ms"],
        mean_itl_ms=i["mean_itl_ms"],
        median_itl_ms=i["median_itl_ms"],
        p99_itl_ms=i["p99_itl_ms"],
        mean_e2el_ms=e["mean_e2el_ms"],
        median_e2el_ms=e["median_e2el_ms"],
        p99_e2el_ms=e["p99_e2el_ms"],
        output_throughput=total_out / duration_s if duration_s > 0 else 0.0,
        request_throughput=len(done) / duration_s if duration_s > 0 else 0.0,
        duration_s=duration_s,
        ttft_floor_ms=ttft_floor,
        itl_floor_ms=itl_floor,
        # How close the measurement comes to the floor: 100 % would be the hardware's peak.
        ttft_pct_of_floor=_pct(ttft_floor, t["mean_ttft_ms"]),
        itl_pct_of_floor=_pct(itl_floor, i["median_itl_ms"]),
    )
    requests = tuple(request_record(r) for r in done)
    return SweepPoint(prompt_len, True, None, metrics, requests)


async def run_sweep(
    engine: Engine,
    config: SweepConfig,
    on_point: Callable[[SweepPoint], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    floors: FloorFn | None = None,
) -> SweepResult:
    """Measure every prompt length; a length that fails becomes a failed point."""
    config.validate()
    card = engine.card
    result = SweepResult(config, model=asdict(card) if card else None)
    total = config.warmup + len(config.prompt_lens) * config.runs
    done_units = 0

    def tick() -> None:
        nonlocal done_units
        done_units += 1
        if on_progress:
            on_progress(done_units, total)

    if on_progress:
        on_progress(0, total)
    # Warm-up at the shortest length: the first requests of a fresh engine pay one-off costs.
    warm_len = min(config.prompt_lens)
    if card is not None:
        # vLLM refuses a prompt of max_model_len tokens: one token short of it is the most.
        warm_len = min(warm_len, card.max_model_len - 1)
    for _ in range(config.warmup):
        await _one_request(engine, warm_len, min(config.output_len, 8))
        tick()
    for index, prompt_len in enumerate(config.prompt_lens):
        finished: list[RequestFinished] = []
        duration = 0.0
        try:
            if card is not None:
                # Before the prompt is built: 10^9 synthetic tokens would take GBs first.
                check_prompt_fits(prompt_len, card.max_model_len)
            for _ in range(config.runs):
                batch = [
                    _make_request(engine, prompt_len, config.output_len)
                    for _ in range(config.concurrency)
                ]
                start = time.perf_counter()
                finished += await _send_together(engine, batch)
                duration += time.perf_counter() - start
                tick()
            point = summarize(prompt_len, finished, duration, floors)
        except KvscopeError as exc:
            point = SweepPoint(prompt_len, False, exc.plain(), None)
            # Count the runs this length will not make, so progress stays truthful.
            done_units = config.warmup + (index + 1) * config.runs - 1
            tick()
        result.points.append(point)
        if on_point:
            on_point(point)
    if on_progress:
        on_progress(total, total)
    return result
