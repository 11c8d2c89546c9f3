"""A vLLM server's state from its Prometheus /metrics text.

Parsing is prometheus_client's own (`text_string_to_metric_families`); nothing here reads
the text by hand. `ScrapeState` turns consecutive scrapes into ScrapeSamples: gauges as
they are, counters as rates between scrapes, histograms as deltas since attach. Every
metric carries an `engine` label (the data-parallel rank): each label gets its own row.
Which metrics those are, by name, is engine/remote/vllm_metrics.py's to say.

Every vllm: sample is checked before it is kept (`_check`): a finite value, not below 0
(a usage fraction at most 1), an `engine` label of plain ASCII, an `le` that is a number.
One that fails is dropped and counted, never raised: a server's bad gauge must not stop
the scrapes for the session. A line the parser cannot read costs only that line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from engine.events import EngineRow, HistogramDelta, ScrapeSample, StepPerf, StepSample
from engine.remote import vllm_metrics as vm

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("kvscope")

# kvscope's key for each counter and histogram it reads (the histograms' keys are
# ScrapeSample's field names).
COUNTERS = {
    "prompt": vm.PROMPT_TOKENS,
    "generation": vm.GENERATION_TOKENS,
    "preemptions": vm.PREEMPTIONS,
    "queries": vm.PREFIX_CACHE_QUERIES,
    "hits": vm.PREFIX_CACHE_HITS,
    "flops": vm.ESTIMATED_FLOPS,
    "read_bytes": vm.ESTIMATED_READ_BYTES,
    "write_bytes": vm.ESTIMATED_WRITE_BYTES,
}
PERF_KEYS = ("flops", "read_bytes", "write_bytes")
PERF_SOURCE = "vllm counters"
"""`StepPerf.source` of a scrape window's counts: the estimated counters' deltas."""
HISTOGRAMS = {
    "ttft": vm.TIME_TO_FIRST_TOKEN,
    "itl": vm.INTER_TOKEN_LATENCY,
    "queue_time": vm.QUEUE_TIME,
    "e2e": vm.E2E_LATENCY,
}

Labels = dict[str, str]


@dataclass
class ParsedMetrics:
    """Every good vllm: sample of one /metrics text, by sample name (`..._total`,
    `..._bucket`), and how many were dropped as bad, with the first one's reason."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    bad: int = 0
    first_bad: str = ""

    def drop(self, why: str) -> None:
        self.bad += 1
        if not self.first_bad:
            self.first_bad = why[:200]

    def get(self, name: str) -> list[tuple[Labels, float]]:
        return self.samples.get(name, [])

    @property
    def has_vllm(self) -> bool:
        return any(name.startswith(vm.PREFIX) for name in self.samples)


# The label values kvscope reads as names: ASCII words, as vLLM writes them.
_LABEL_WORD = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
# Fractions of the pool: 1 plus rounding at most.
_FRACTIONS = (vm.KV_USAGE,)
_FRACTION_SLACK = 1e-6


def _check(name: str, labels: Labels, value: object) -> str | None:
    """Why this vllm: sample cannot be used, or None if it can."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"{name} has a value that is not a number"
    if not math.isfinite(value):
        return f"{name} is {value}"
    if value < 0:
        return f"{name} is {value:g}, below 0"
    if name in _FRACTIONS and value > 1 + _FRACTION_SLACK:
        return f"{name} is {value:g}, above 1"
    engine = labels.get("engine")
    if engine is not None and not _LABEL_WORD.match(engine):
        return f"{name} has an engine label {engine[:20]!r} that is not a plain name"
    if "le" in labels:
        try:
            bound = float(labels["le"])
        except ValueError:
            return f"{name} has le={labels['le'][:20]!r}, not a number"
        if math.isnan(bound):
            return f"{name} has le=NaN"
    return None


def _families(text: str, parsed: ParsedMetrics) -> list[tuple[str, Labels, float]]:
    """Every vllm: sample as the parser reads it; if one line stops the parser, each line
    is read on its own, so that only the lines it cannot read are lost (and counted)."""
    try:
        return [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith(vm.PREFIX)
        ]
    except Exception:  # prometheus_client raises ValueError, TypeError, IndexError, ...
        pass
    out: list[tuple[str, Labels, float]] = []
    for line in text.splitlines():
        if not line.startswith(vm.PREFIX):
            continue  # comments, other exporters' samples: not read, so not checked
        try:
            for family in text_string_to_metric_families(line + "\n"):
                out += [(s.name, dict(s.labels), s.value) for s in family.samples]
        except Exception:
            parsed.drop(f"a line the parser cannot read: {line[:60]!r}")
    return out


def parse_metrics(text: str) -> ParsedMetrics:
    """The good vllm: samples of one /metrics text (see the module's docstring)."""
    parsed = ParsedMetrics()
    for name, labels, value in _families(text, parsed):
        why = _check(name, labels, value)
        if why is not None:
            parsed.drop(why)
            continue
        parsed.samples.setdefault(name, []).append((labels, float(value)))
    return parsed


@dataclass(frozen=True)
class CacheInfo:
    """The KV pool as `vllm:cache_config_info` tells it."""

    block_size: int
    num_gpu_blocks: int  # as reported: summed over data-parallel engines
    engines: tuple[str, ...]
    kv_cache_size_tokens: int | None
    prefix_caching: bool | None
    cache_dtype: str

    @property
    def blocks_per_engine(self) -> int:
        """Usable blocks of one engine: its share of num_gpu_blocks less the null block."""
        n = max(1, len(self.engines))
        return max(0, self.num_gpu_blocks // n - 1)

    @property
    def total_blocks(self) -> int:
        return self.blocks_per_engine * max(1, len(self.engines))


# Past these a pool is a lie: 2^20 tokens a block, 2^31 blocks.
MAX_BLOCK_SIZE = 1 << 20
MAX_BLOCKS = 1 << 31


def _int(value: str | None, limit: int = 1 << 62) -> int | None:
    """A whole number from 0 to `limit` from a label, else None (unknown)."""
    if value is None or value in ("", "None"):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or not 0 <= number <= limit:
        return None
    return int(number)


def cache_info(parsed: ParsedMetrics) -> CacheInfo | None:
    rows = parsed.get(vm.CACHE_INFO)
    if not rows:
        return None
    labels = rows[0][0]
    block_size = _int(labels.get("block_size"), MAX_BLOCK_SIZE) or 0
    blocks = _int(labels.get("num_gpu_blocks"), MAX_BLOCKS) or 0
    engines = tuple(sorted({lab.get("engine", "0") for lab, _ in rows}, key=_engine_key))
    caching = labels.get("enable_prefix_caching")
    return CacheInfo(
        block_size=block_size,
        num_gpu_blocks=blocks,
        engines=engines,
        kv_cache_size_tokens=_int(labels.get("kv_cache_size_tokens")),
        prefix_caching=None if caching is None else caching == "True",
        cache_dtype=labels.get("cache_dtype", "auto"),
    )


def _engine_key(engine: str) -> tuple[int, str]:
    # isdigit() alone is true of "²", which int() refuses.
    return (int(engine), "") if engine.isascii() and engine.isdigit() else (1 << 30, engine)


@dataclass
class _Snapshot:
    """One scrape reduced to what ScrapeState needs, per engine label."""

    counters: dict[str, dict[str, float]]  # engine -> counter key -> value
    running: dict[str, float]
    waiting: dict[str, float]
    waiting_by_reason: dict[str, dict[str, float]]
    usage: dict[str, float]
    histograms: dict[str, tuple[dict[float, float], float, float]]  # key -> buckets, count, sum


def _mine(labels: Labels, model: str | None) -> bool:
    return model is None or labels.get("model_name", model) == model


def _snapshot(parsed: ParsedMetrics, model: str | None) -> _Snapshot:
    names = {lab.get("model_name") for rows in parsed.samples.values() for lab, _ in rows}
    if model not in names:
        model = None  # served under another name: take every row

    def per_engine(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in parsed.get(name):
            if _mine(labels, model):
                engine = labels.get("engine", "0")
                out[engine] = out.get(engine, 0.0) + value
        return out

    counters: dict[str, dict[str, float]] = {}
    for key, name in COUNTERS.items():
        for engine, value in per_engine(name).items():
            counters.setdefault(engine, {})[key] = value
    by_reason: dict[str, dict[str, float]] = {}
    for labels, value in parsed.get(vm.WAITING_BY_REASON):
        if _mine(labels, model):
            engine = labels.get("engine", "0")
            by_reason.setdefault(engine, {})[labels.get("reason", "?")] = value
    histograms: dict[str, tuple[dict[float, float], float, float]] = {}
    for key, name in HISTOGRAMS.items():
        buckets: dict[float, float] = {}
        for labels, value in parsed.get(name + "_bucket"):
            if _mine(labels, model) and "le" in labels:
                le = float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + value
        count = sum(per_engine(name + "_count").values())
        total = sum(per_engine(name + "_sum").values())
        histograms[key] = (buckets, count, total)
    return _Snapshot(
        counters=counters,
        running=per_engine(vm.RUNNING),
        waiting=per_engine(vm.WAITING),
        waiting_by_reason=by_reason,
        usage=per_engine(vm.KV_USAGE),
        histograms=histograms,
    )


def _went_back(now: _Snapshot, before: _Snapshot) -> bool:
    """A counter below its earlier value: the server restarted."""
    for engine, values in before.counters.items():
        for key, old in values.items():
            if now.counters.get(engine, {}).get(key, old) < old:
                return True
    for key, (_, old_count, _) in before.histograms.items():
        if now.histograms.get(key, ({}, old_count, 0.0))[1] < old_count:
            return True
    return False


def _histogram_delta(
    name: str,
    now: tuple[dict[float, float], float, float],
    base: tuple[dict[float, float], float, float] | None,
) -> HistogramDelta:
    buckets, count, total = now
    b_buckets, b_count, b_total = base if base is not None else ({}, 0.0, 0.0)
    rows = tuple(
        (le, max(0, round(value - b_buckets.get(le, 0.0)))) for le, value in sorted(buckets.items())
    )
    return HistogramDelta(
        name=name,
        buckets=rows,
        count=max(0, round(count - b_count)),
        total=max(0.0, total - b_total),
    )


class ScrapeState:
    """Consecutive scrapes of one server into ScrapeSamples (deltas since attach)."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model
        self._base: _Snapshot | None = None
        self._prev: _Snapshot | None = None
        self._prev_time: float | None = None
        self._seq = 0
        self.restarted = False

    def update(self, parsed: ParsedMetrics, now: float, cache: CacheInfo | None) -> ScrapeSample:
        snap = _snapshot(parsed, self.model)
        if self._base is None:
            self._base = snap
        elif _went_back(snap, self._prev or self._base):
            # Counters started again from zero: deltas now run from the restart.
            self._base = _Snapshot({}, {}, {}, {}, {}, {})
            self._prev = None
            self.restarted = True
        prev = self._prev
        interval = now - self._prev_time if self._prev_time is not None else 0.0
        self._prev, self._prev_time = snap, now
        self._seq += 1
        base = self._base

        per_engine_blocks = cache.blocks_per_engine if cache else 0
        engines = sorted(
            set(snap.usage) | set(snap.running) | set(snap.waiting) | set(snap.counters),
            key=_engine_key,
        )

        def delta(engine: str, key: str, since: _Snapshot | None) -> float:
            now_v = snap.counters.get(engine, {}).get(key, 0.0)
            then = since.counters.get(engine, {}).get(key, 0.0) if since else 0.0
            return max(0.0, now_v - then)

        rows = []
        for engine in engines:
            usage = snap.usage.get(engine, 0.0)
            queries = delta(engine, "queries", base)
            rows.append(
                EngineRow(
                    engine=engine,
                    running=round(snap.running.get(engine, 0.0)),
                    waiting=round(snap.waiting.get(engine, 0.0)),
                    waiting_by_reason=tuple(
                        (reason, round(v))
                        for reason, v in sorted(snap.waiting_by_reason.get(engine, {}).items())
                    ),
                    kv_usage=usage,
                    used_blocks=round(usage * per_engine_blocks),
                    total_blocks=per_engine_blocks,
                    preemptions=round(delta(engine, "preemptions", base)),
                    prompt_tokens_per_s=_rate(delta(engine, "prompt", prev), interval, prev),
                    generation_tokens_per_s=_rate(
                        delta(engine, "generation", prev), interval, prev
                    ),
                    prefix_cache_hit_rate=(
                        delta(engine, "hits", base) / queries if queries > 0 else None
                    ),
                )
            )
        prompt = sum(delta(e, "prompt", prev) for e in engines) if prev else 0.0
        generation = sum(delta(e, "generation", prev) for e in engines) if prev else 0.0
        queries = sum(delta(e, "queries", base) for e in engines)
        hits = sum(delta(e, "hits", base) for e in engines)
        reasons: dict[str, int] = {}
        for row in rows:
            for reason, n in row.waiting_by_reason:
                reasons[reason] = reasons.get(reason, 0) + n
        hists = {
            key: _histogram_delta(name, snap.histograms[key], base.histograms.get(key))
            for key, name in HISTOGRAMS.items()
        }
        used = sum(r.used_blocks for r in rows)
        total = per_engine_blocks * max(1, len(rows)) if per_engine_blocks else 0
        return ScrapeSample(
            seq=self._seq,
            time_s=now,
            interval_s=interval,
            rows=tuple(rows),
            running=sum(r.running for r in rows),
            waiting=sum(r.waiting for r in rows),
            waiting_by_reason=tuple(sorted(reasons.items())),
            kv_usage=(sum(r.kv_usage for r in rows) / len(rows)) if rows else 0.0,
            used_blocks=used,
            total_blocks=total,
            block_size=cache.block_size if cache else 0,
            preemptions=sum(r.preemptions for r in rows),
            new_preemptions=round(sum(delta(e, "preemptions", prev) for e in engines))
            if prev
            else 0,
            prompt_tokens=round(prompt),
            generation_tokens=round(generation),
            prompt_tokens_per_s=sum(r.prompt_tokens_per_s for r in rows),
            generation_tokens_per_s=sum(r.generation_tokens_per_s for r in rows),
            prefix_cache_hit_rate=hits / queries if queries > 0 else None,
            **hists,
            server_restarted=self.restarted,
            perf=_window_perf(snap, prev, engines),
        )


def _window_perf(now: _Snapshot, prev: _Snapshot | None, engines: list[str]) -> StepPerf | None:
    """The work the server counted between the previous scrape and this one, per GPU: each
    engine's deltas of the three estimated counters, averaged over the data-parallel
    engines that report them (each is already per GPU of its own TP x PP). None before a
    window exists, or while no FLOP was ever counted: vLLM 0.32 exports the counters at
    zero without --enable-mfu-metrics, so a server that ran tokens and counted no FLOPs
    has the flag off (and one that ran nothing yet has no point to draw)."""
    if prev is None:
        return None
    reporting = [e for e in engines if all(k in now.counters.get(e, {}) for k in PERF_KEYS)]
    if not reporting or not any(now.counters[e]["flops"] > 0 for e in reporting):
        return None
    totals = dict.fromkeys(PERF_KEYS, 0.0)
    for engine in reporting:
        for key in PERF_KEYS:
            then = prev.counters.get(engine, {}).get(key, 0.0)
            totals[key] += max(0.0, now.counters[engine][key] - then)
    n = len(reporting)
    return StepPerf(
        flops=totals["flops"] / n,
        read_bytes=totals["read_bytes"] / n,
        write_bytes=totals["write_bytes"] / n,
        source=PERF_SOURCE,
    )


def _rate(amount: float, interval: float, prev: _Snapshot | None) -> float:
    return amount / interval if prev is not None and interval > 0 else 0.0


def step_sample(sample: ScrapeSample) -> StepSample:
    """The StepSample the shared engine panels take; one scrape stands in for a step.

    prefill/decode are the prompt and generation token counters' growth since the previous
    scrape (all requests, whole interval), not one step's split; no block IDs are known.
    """
    return StepSample(
        step=sample.seq,
        started_at=sample.time_s - sample.interval_s,
        duration_s=sample.interval_s,
        prefill_tokens=sample.prompt_tokens,
        decode_tokens=sample.generation_tokens,
        running=sample.running,
        waiting=sample.waiting,
        kv_usage=sample.kv_usage,
        free_blocks=max(0, sample.total_blocks - sample.used_blocks),
        total_blocks=sample.total_blocks,
        block_size=sample.block_size,
        preemptions=sample.new_preemptions,
        perf=sample.perf,
    )


@dataclass(frozen=True)
class ScrapeStatus:
    reachable: bool
    available: bool
    note: str


class MetricsScraper:
    """Scrapes /metrics on its own thread at `interval_s`, slower while it fails.

    `fetch` returns the text or raises; `on_sample` gets each ScrapeSample; `on_status`
    hears every change between working, missing (the server answers, /metrics does not)
    and unreachable.
    """

    def __init__(
        self,
        fetch: Callable[[], str],
        state: ScrapeState,
        on_sample: Callable[[ScrapeSample, CacheInfo | None], None],
        on_status: Callable[[ScrapeStatus], None],
        classify: Callable[[BaseException], ScrapeStatus],
        interval_s: float = 0.2,
        retry_s: float = 1.0,
    ) -> None:
        self.fetch = fetch
        self.state = state
        self.on_sample = on_sample
        self.on_status = on_status
        self.classify = classify
        self.interval_s = interval_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = ScrapeStatus(True, True, "")
        self.bad_samples = 0  # dropped since attach (see `_check`)
        self.first_bad = ""

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvscope-scrape", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _set(self, status: ScrapeStatus) -> None:
        if status != self.status:
            self.status = status
            with contextlib.suppress(Exception):
                self.on_status(status)

    def scrape_once(self) -> ScrapeSample | None:
        try:
            text = self.fetch()
            parsed = parse_metrics(text)
        except Exception as exc:
            self._set(self.classify(exc))
            return None
        self.bad_samples += parsed.bad
        self.first_bad = self.first_bad or parsed.first_bad
        if not parsed.has_vllm:
            self._set(
                ScrapeStatus(
                    True, False, f"the metrics endpoint answered, but with no {vm.PREFIX} metrics"
                )
            )
            return None
        try:
            cache = cache_info(parsed)
            sample = self.state.update(parsed, time.perf_counter(), cache)
        except Exception:  # checked samples should never get here; the thread lives on
            log.exception("kvscope: a /metrics scrape could not be read")
            self.bad_samples += 1
            self.first_bad = self.first_bad or "a scrape that could not be read"
            return None
        self._set(ScrapeStatus(True, True, ""))
        try:
            self.on_sample(sample, cache)
        except Exception:
            log.exception("kvscope: scrape listener failed")
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                sample = self.scrape_once()
            except Exception:  # a thread that dies of one scrape is a session without any
                log.exception("kvscope: scrape failed")
                sample = None
            wait = self.interval_s if sample is not None else self.retry_s
            self._stop.wait(max(0.0, wait - (time.perf_counter() - began)))
