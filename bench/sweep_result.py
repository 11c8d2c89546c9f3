"""The sweep's result: its config, one point per prompt length, and their JSON and CSV form.

Field names follow `vllm bench` (`mean_ttft_ms`, `median_itl_ms`, ...) so results can be
read side by side; `SweepResult.from_dict` reads back what `to_dict` wrote, naming the first
key that is wrong.
"""

from __future__ import annotations

import csv
import io
import json
import secrets
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.errors import BadOption
from roofline.point_perf import PointRoofline, PointRoofs

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


def fresh_seed() -> int:
    """A prompt seed of its own for each run: two runs draw different prompts."""
    return secrets.randbelow(2**31)


@dataclass(frozen=True)
class SweepConfig:
    prompt_lens: tuple[int, ...] = (512, 1024, 2048, 4096)
    output_len: int = 128
    runs: int = 3
    warmup: int = 1
    concurrency: int = 1
    seed: int = field(default_factory=fresh_seed)
    """What the synthetic prompts are drawn from; the same seed draws the same prompts."""

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
    # The point on the roofline (FLOP/s, bytes/s, intensity), or why not; None: not asked.
    roofline: PointRoofline | None = None

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
    # The roofs each point's share is of, or why there are none.
    roofs: PointRoofs | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "complete": self.complete,
            "model": self.model,
            "hardware": self.hardware,
            **roofs_record(self.roofs),
            "points": [
                {**p.row(), **point_record(p.roofline, self.roofs), "requests": list(p.requests)}
                for p in self.points
            ],
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
        cfg = required_key(data, "config", where, dict)
        in_cfg = f'{where}\'s "config"'

        def whole(key: str) -> int:
            return _whole(required_key(cfg, key, in_cfg), f'{in_cfg} has "{key}"')

        config = SweepConfig(
            prompt_lens=tuple(
                _whole(n, f'{in_cfg} has a "prompt_lens" entry')
                for n in required_key(cfg, "prompt_lens", in_cfg, list)
            ),
            output_len=whole("output_len"),
            runs=whole("runs"),
            warmup=whole("warmup"),
            concurrency=whole("concurrency"),
            # A file from before the seed was kept has none: 0 stands in for it.
            seed=_whole(cfg.get("seed", 0), f'{in_cfg} has "seed"'),
        )
        points = []
        for n, p in enumerate(required_key(data, "points", where, list), 1):
            at = f"point {n} of {where}"
            ok = required_key(p, "ok", at, bool)
            if ok:
                for name in _METRIC_NAMES & p.keys():
                    value = p[name]
                    if value not in ("", None) and not _is_number(value):
                        raise ValueError(f'{at} has "{name}": {value!r}, not a number')
            points.append(
                SweepPoint(
                    _whole(required_key(p, "prompt_len", at), f'{at} has "prompt_len"'),
                    ok,
                    p.get("error") or None,
                    SweepMetrics.from_dict(p) if ok else None,
                    tuple(p.get("requests", ())),
                    read_point_roofline(p, at),
                )
            )
        model, hardware = data.get("model"), data.get("hardware")
        return cls(
            config,
            points,
            model if isinstance(model, dict) else None,
            hardware if isinstance(hardware, dict) else None,
            bool(data.get("complete", True)),
            read_roofs(data, where),
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


def required_key(data: Any, key: str, where: str, kind: type | None = None) -> Any:
    """`data[key]`, or a ValueError in words: `where` is not an object, has no `key`, or
    holds another kind of value there (a saved compare file is read with it too)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} is not a JSON object")
    if key not in data:
        raise ValueError(f'{where} has no "{key}" key')
    value = data[key]
    if kind is not None and not isinstance(value, kind):
        what = {dict: "an object", list: "a list", bool: "true or false"}.get(kind, kind.__name__)
        raise ValueError(f'{where} has "{key}": {value!r}, not {what}')
    return value


def roofs_record(roofs: PointRoofs | str | None) -> dict[str, Any]:
    """A result's "roofs" key: the roofs, or why none ({} where not asked)."""
    if roofs is None:
        return {}
    if isinstance(roofs, str):
        return {"roofs": {"missing": roofs}}
    return {"roofs": roofs.to_dict()}


def point_record(roofline: PointRoofline | None, roofs: PointRoofs | str | None) -> dict[str, Any]:
    """A point's "roofline" key ({} where not asked)."""
    if roofline is None:
        return {}
    return {"roofline": roofline.to_dict(roofs if isinstance(roofs, PointRoofs) else None)}


def read_roofs(data: dict[str, Any], where: str) -> PointRoofs | str | None:
    """The roofs `roofs_record` wrote (a file from before them has none)."""
    saved = data.get("roofs")
    if saved is None:
        return None
    if isinstance(saved, dict) and "peak_flops" not in saved:
        return str(saved.get("missing") or "the file names no roofs")
    return PointRoofs.from_dict(saved, f'{where}\'s "roofs"')


def read_point_roofline(point: dict[str, Any], at: str) -> PointRoofline | None:
    """A point's roofline figures as `point_record` wrote them (None: a file from before)."""
    saved = point.get("roofline")
    return None if saved is None else PointRoofline.from_dict(saved, f'{at}\'s "roofline"')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: Any, what: str) -> int:
    """`value` as a whole number; `what` says where it was ('point 2 has "prompt_len"')."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: {value!r}, not a whole number")
    return value
