"""The sweep screen's load mode, as pure functions: the form's words read into a
`LoadConfig`, where the run stands ("level 2 of 4 · 2 users · …"), about how long is left
from the levels done, and the table's cells. A test reads them without a screen."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.load_result import LoadConfig, LoadMode
from bench.load_runner import validate
from engine.errors import BadOption
from tui import format as fmt

if TYPE_CHECKING:
    from bench.load_result import LoadPoint
    from bench.load_runner import LoadTick
    from engine.events import ModelCard

DEFAULT_LEVELS = "1 2 4 8 users"
"""Sized for a slow CPU: four levels of short requests take about a minute there."""
DEFAULT_PROMPT_LEN = 64
DEFAULT_OUTPUT_LEN = 32
DEFAULT_REQUESTS = 8
"""Per level, as `kvscope bench --num-prompts`: every user gets one at 8 users."""
DEFAULT_WARMUP = 1

_USERS = ("users", "user")
_RATES = ("req/s", "rps", "/s")
_FIELDS = {
    "--concurrency": "load levels",
    "--request-rate": "load levels",
    "--num-prompts": "requests/level",
    "--prompt-lens": "prompt and output tokens",
    "--warmup": "warm-up",
}
"""The CLI option a runner check names, as the form's field is labelled."""


@dataclass(frozen=True)
class LoadForm:
    """The load mode's fields, as typed."""

    levels: str = DEFAULT_LEVELS
    prompt_len: str = str(DEFAULT_PROMPT_LEN)
    output_len: str = str(DEFAULT_OUTPUT_LEN)
    requests: str = str(DEFAULT_REQUESTS)
    warmup: str = str(DEFAULT_WARMUP)


def parse_levels(text: str) -> tuple[LoadMode, tuple[float, ...]]:
    """ "1 2 4 8 users" (or no unit) -> users; "0.5, 1, 2 req/s" (inf allowed) -> rates.

    Raises ValueError in words."""
    words = text.replace(",", " ").split()
    mode: LoadMode = "concurrency"
    if words and words[-1].lower() in (*_USERS, *_RATES):
        mode = "rate" if words.pop().lower() in _RATES else "concurrency"
    if not words:
        raise ValueError("load levels: give numbers of users, e.g. 1 2 4 8 users (or 1 2 req/s)")
    levels = []
    for w in words:
        try:
            value = float(w)
        except ValueError:
            raise ValueError(f"load levels: {w!r} is not a number") from None
        if mode == "concurrency" and (not math.isfinite(value) or value != int(value)):
            raise ValueError(f"load levels: {w!r} users is not a whole number")
        levels.append(value)
    return mode, tuple(levels)


def _whole(raw: str, name: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}: {raw.strip()!r} is not a whole number") from None


def read_load_form(form: LoadForm, card: ModelCard | None, seed: int) -> LoadConfig:
    """The form as a load run's config, checked as the CLI checks its flags (the same
    `bench.load_runner.validate`), with the field's name in the message.

    Raises ValueError in words."""
    mode, levels = parse_levels(form.levels)
    prompt_len = _whole(form.prompt_len, "prompt tokens")
    output_len = _whole(form.output_len, "output tokens")
    requests = _whole(form.requests, "requests/level")
    warmup = _whole(form.warmup, "warm-up")
    config = LoadConfig(
        mode=mode,
        levels=levels,
        prompt_len=prompt_len,
        output_len=output_len,
        num_prompts=requests,
        warmup=warmup,
        seed=seed,
    )
    try:
        validate(config)
    except BadOption as exc:
        raise ValueError(f"{_FIELDS.get(exc.option, exc.option)}: {exc.reason}") from None
    if card is not None and card.max_model_len and prompt_len + output_len > card.max_model_len:
        raise ValueError(
            f"prompt and output tokens: {prompt_len:,} + {output_len:,} is past the context "
            f"limit (max_model_len) of {card.max_model_len:,}"
        )
    return config


def level_work(config: LoadConfig, level: float) -> tuple[float, float]:
    """(x, units) of one level, for the time-left fit: a closed loop's time goes by rounds
    of its users' replies (x: the users, a round costs more with more of them); an open
    loop's by requests at its rate (x: seconds between sends)."""
    requests = float(config.num_prompts or 1)
    if config.mode == "concurrency":
        users = max(level, 1.0)
        return users, math.ceil(requests / users)
    return (0.0 if math.isinf(level) else 1.0 / level), requests


def per_unit_s(done: list[tuple[float, float]], x: float) -> float:
    """Seconds per unit of work at `x`, from the levels done: a line fitted through them,
    or their mean while only one x is known (batching makes a round of 8 users cost far
    less than 8 rounds of one, so time is not assumed to grow in proportion)."""
    xs = [a for a, _ in done]
    ys = [b for _, b in done]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((a - mean_x) ** 2 for a in xs)
    if var <= 0:
        return mean_y
    slope = sum((a - mean_x) * (b - mean_y) for a, b in done) / var
    return max(0.0, mean_y + slope * (x - mean_x))


@dataclass
class LoadProgress:
    """Where a load sweep stands, fed by the runner's ticks and finished points; its times
    are on the engine's clock (virtual under test), so its words are reproducible."""

    config: LoadConfig
    tick: LoadTick | None = None
    done: list[tuple[float, float]] | None = None
    """(x, seconds per unit) of each level measured, for `per_unit_s`'s fit."""

    def level_done(self, point: LoadPoint) -> None:
        x, units = level_work(self.config, point.level)
        if self.done is None:
            self.done = []
        if units > 0 and point.duration_s > 0:
            self.done.append((x, point.duration_s / units))

    def fraction(self) -> float:
        """Of the whole sweep, done: levels done plus the running level's share."""
        n = len(self.config.levels)
        t = self.tick
        if t is None:
            return 0.0
        within = t.done / t.planned if t.planned else 0.0
        return min(1.0, (t.point - 1 + within) / n)

    def seconds_left(self) -> float | None:
        """From the levels done: each level's work at the fitted time per unit."""
        t = self.tick
        if not self.done or t is None:
            return None
        levels = self.config.levels
        total = 0.0
        for k in range(t.point - 1, len(levels)):
            x, units = level_work(self.config, levels[k])
            per_unit = per_unit_s(self.done, x)
            share = 1.0
            if k == t.point - 1 and t.planned:
                share = max(0.0, 1.0 - t.done / t.planned)
            total += share * units * per_unit
        return total

    def line(self) -> str:
        """ "level 2 of 4 · 2 users · 5 of 8 done, 2 in flight · about 12 s left"."""
        t = self.tick
        if t is None:
            return "warm-up" if self.config.warmup else "starting"
        of = f" of {t.points}" if t.points else ""
        planned = f" of {t.planned}" if t.planned else ""
        words = (
            f"level {t.point}{of} · {t.label} · {t.done}{planned} done, {t.sent - t.done} in flight"
        )
        left = self.seconds_left()
        return f"{words} · about {fmt.duration(left)} left" if left is not None else words


def number(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:,.{digits}f}"


def batch_cell(point: LoadPoint) -> str:
    """The engine's own running batch over the point: "3.8 (max 4)", "–" unseen."""
    s = point.steps
    if s is None:
        return "–"
    return f"{s.mean_running:.1f} (max {s.max_running})"


def result_cell(point: LoadPoint) -> str:
    if not point.ok:
        return f"✗ {point.error or 'failed'}"
    if point.stopped_early:
        return "stopped early"
    return "ok"


def point_notes(points: list[LoadPoint]) -> list[str]:
    """One line per note of each level: queueing, preemptions, and an early stop
    (over-saturation) first, with a warning sign."""
    lines = []
    for p in points:
        for note in p.notes:
            sign = "⚠ " if note.startswith("stopped early") else ""
            lines.append(f"{sign}{p.label}: {note}")
        if not p.ok and p.stopped_early:
            lines.append(f"⚠ {p.label}: stopped early: {p.stopped_early}")
    return lines


def done_words(points: list[LoadPoint]) -> str:
    """The status when a load sweep ends: levels measured, failed, stopped early."""
    failed = sum(1 for p in points if not p.ok)
    early = sum(1 for p in points if p.stopped_early)
    tail = []
    if failed:
        tail.append(f"{failed} failed: see the table")
    if early:
        tail.append(f"{early} stopped early: over-saturated, see the notes")
    extra = f" ({'; '.join(tail)})" if tail else ""
    return f"Done: {fmt.count(len(points), 'load level')} measured{extra}. F7/F8 export."
