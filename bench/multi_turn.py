"""A multi-turn chat workload on any Engine: M sessions of N turns, each turn the whole
conversation so far plus a new user message.

Each session is one user: its turns go in order, each sent when the last reply has ended,
and its next prompt holds that reply as it was received (not a made-up one), so the prompt
of turn t+1 starts with the prompt of turn t, as a real chat's does. The sessions run at
once. That is the workload where prefix caching, and a router that knows where each
prefix is cached, decide the TTFT of every turn after the first.

Messages are seeded words (about one token each); each session's first message differs
from every other session's and every other run's (`tag`), so one run never finds another
run's prefixes cached. Replies have exactly `output_len` tokens (EOS ignored), so every
run does the same work. Nothing here prints: progress goes to `on_progress`.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from engine.clock import Clock, RealClock
from engine.errors import BadOption, KvscopeError
from engine.events import (
    ChatMessage,
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    TokenEvent,
)
from engine.stats import mean, percentile

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.protocol import Engine

MAX_SESSIONS = 1024
MAX_TURNS = 256
MAX_MESSAGE_LEN = 100_000
# A chat template's own tokens around each message ("<|im_start|>user\n ... <|im_end|>\n")
# and its system prompt: an estimate, to refuse a run whose last turn cannot fit.
TEMPLATE_TOKENS_PER_MESSAGE = 6
TEMPLATE_TOKENS_FIXED = 32

# Common English words, each one token (with its leading space) in the BPE vocabularies
# of the usual chat models, so a message of n words is about n tokens.
WORDS = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
    "world", "school", "state", "family", "student", "group", "country", "problem", "hand",
    "part", "place", "case", "week", "company", "system", "program", "question", "work",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business",
    "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour",
    "game", "line", "end", "member", "law", "car", "city", "name", "team", "minute", "idea",
    "body", "back", "parent", "face", "others", "level", "office", "door", "health", "art",
)  # fmt: skip


@dataclass(frozen=True)
class MultiTurnConfig:
    """What a multi-turn run sends: `sessions` chats of `turns` turns each."""

    sessions: int = 1
    turns: int = 4
    message_len: int = 64  # words (about tokens) in each new user message
    output_len: int = 32  # tokens in each reply (EOS ignored)
    seed: int = 0
    warmup: int = 1  # short requests before the run, not measured

    def validate(self) -> None:
        """Bounds no machine can use, refused before any work, in one plain line."""
        if not 1 <= self.sessions <= MAX_SESSIONS:
            raise BadOption(
                "--sessions", f"{self.sessions:,} is not between 1 and {MAX_SESSIONS:,}"
            )
        if not 1 <= self.turns <= MAX_TURNS:
            raise BadOption("--turns", f"{self.turns:,} is not between 1 and {MAX_TURNS:,}")
        if not 1 <= self.message_len <= MAX_MESSAGE_LEN:
            raise BadOption(
                "--message-len", f"{self.message_len:,} is not between 1 and {MAX_MESSAGE_LEN:,}"
            )
        if self.output_len < 1:
            raise BadOption("--output-len", f"{self.output_len:,} is not a positive length")
        if self.warmup < 0:
            raise BadOption("--warmup", f"{self.warmup} is negative")

    def last_prompt_estimate(self) -> int:
        """About how long the last turn's prompt is: every message so far, templated."""
        messages = 2 * self.turns - 1
        return (
            self.turns * self.message_len
            + (self.turns - 1) * self.output_len
            + messages * TEMPLATE_TOKENS_PER_MESSAGE
            + TEMPLATE_TOKENS_FIXED
        )

    def check_fits(self, max_model_len: int | None) -> None:
        """Refuse a run whose last turn would pass the context limit, before it starts."""
        if not max_model_len:
            return
        need = self.last_prompt_estimate() + self.output_len
        if need > max_model_len:
            raise BadOption(
                "--turns",
                f"{self.turns} turns of {self.message_len:,}-word messages and "
                f"{self.output_len:,}-token replies reach about {need:,} tokens by the last "
                f"reply, past the context limit (max_model_len) of {max_model_len:,}: "
                "give fewer turns or shorter messages",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def message_text(config: MultiTurnConfig, tag: str, session: int, turn: int) -> str:
    """The user's message of one turn: seeded words, different for every run tag, session
    and turn (the first words of a session's first message start its unique prefix)."""
    rng = random.Random(f"{config.seed}/{tag}/{session}/{turn}")
    return " ".join(rng.choice(WORDS) for _ in range(config.message_len))


def cached_tokens(done: RequestFinished) -> int | None:
    """The prompt tokens the engine found in its prefix cache, where it says: the engine's
    own count, else a server's per-request figure (`usage.prompt_tokens_details`)."""
    if done.cached_prompt_tokens is not None:
        return done.cached_prompt_tokens
    if done.server is not None:
        return done.server.cached_prompt_tokens
    return None


@dataclass(frozen=True)
class TurnRecord:
    """One request of the run: which session and turn, and what it measured."""

    session: int  # 0-based
    turn: int  # 1-based
    request_id: str
    sent_s: float  # from the run's start
    ttft_s: float | None = None
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None  # None: the engine does not say
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class TurnSummary:
    """The requests of one turn index (or of all turns): TTFT and the prefix hit rate."""

    turns: str  # "1", "2-4", "all"
    requests: int
    failed: int
    # None where no request of these turns finished: no TTFT was measured, which 0 ms
    # (the mean of nothing) would claim as the fastest of all.
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    prompt_tokens: int
    cached_prompt_tokens: int | None  # summed where known; None: no request said
    hit_rate: float | None  # cached / prompt tokens over the requests that said

    @classmethod
    def of(cls, turns: str, records: Sequence[TurnRecord]) -> TurnSummary:
        ok = [r for r in records if r.ok]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        known = [r for r in ok if r.cached_prompt_tokens is not None]
        cached = sum(r.cached_prompt_tokens or 0 for r in known) if known else None
        said = sum(r.prompt_tokens for r in known)
        return cls(
            turns=turns,
            requests=len(ok),
            failed=len(records) - len(ok),
            mean_ttft_ms=mean(ttft) * 1e3 if ttft else None,
            median_ttft_ms=percentile(ttft, 50) * 1e3 if ttft else None,
            p90_ttft_ms=percentile(ttft, 90) * 1e3 if ttft else None,
            prompt_tokens=sum(r.prompt_tokens for r in ok),
            cached_prompt_tokens=cached,
            hit_rate=(cached or 0) / said if known and said > 0 else None,
        )


@dataclass
class MultiTurnResult:
    """A multi-turn run: its config, every request, and the summaries per turn and overall."""

    config: MultiTurnConfig
    label: str = ""  # the run's name (a router policy) in a comparison
    url: str | None = None  # where the requests went (no credentials)
    records: list[TurnRecord] = field(default_factory=list)
    duration_s: float = 0.0
    model: dict[str, Any] | None = None
    complete: bool = False
    """Every planned turn was sent and finished: False when a session ended early."""

    def by_turn(self) -> list[TurnSummary]:
        return [
            TurnSummary.of(str(t), [r for r in self.records if r.turn == t])
            for t in range(1, self.config.turns + 1)
        ]

    def later(self) -> TurnSummary | None:
        """Turns 2 and on, where a prefix can be cached: None with one turn."""
        n = self.config.turns
        if n < 2:
            return None
        span = "2" if n == 2 else f"2-{n}"
        return TurnSummary.of(span, [r for r in self.records if r.turn >= 2])

    def overall(self) -> TurnSummary:
        return TurnSummary.of("all", self.records)

    @property
    def completed(self) -> int:
        return sum(1 for r in self.records if r.ok)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records if r.ok)

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def not_sent(self) -> int:
        """Planned turns never sent: a session ends at its first turn that failed."""
        return max(self.config.sessions * self.config.turns - len(self.records), 0)

    @property
    def first_error(self) -> str | None:
        return next((r.error for r in self.records if r.error), None)

    def to_dict(self) -> dict[str, Any]:
        later = self.later()
        return {
            "kind": "multi_turn",
            "label": self.label,
            "url": self.url,
            "config": self.config.to_dict(),
            "seed": self.config.seed,
            "complete": self.complete,
            "model": self.model,
            "duration_s": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "not_sent": self.not_sent,
            "total_output_tokens": self.output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "overall": asdict(self.overall()),
            "later_turns": asdict(later) if later is not None else None,
            "turns": [asdict(s) for s in self.by_turn()],
            "requests": [asdict(r) for r in self.records],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        return records_csv([(self.label, r) for r in self.records])


def records_csv(rows: Sequence[tuple[str, TurnRecord]]) -> str:
    """One row per request, named by its run (the policy) first."""
    names = ["label", *(f.name for f in fields(TurnRecord))]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(names)
    for label, record in rows:
        writer.writerow([label, *(getattr(record, f.name) for f in fields(TurnRecord))])
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class MultiTurnTick:
    """Where a run stands, for a progress bar."""

    label: str
    done: int
    planned: int
    elapsed_s: float


async def run_multi_turn(
    engine: Engine,
    config: MultiTurnConfig,
    *,
    label: str = "",
    url: str | None = None,
    clock: Clock | None = None,
    on_progress: Callable[[MultiTurnTick], None] | None = None,
) -> MultiTurnResult:
    """Warm up, then run every session at once, each turn after the last reply."""
    config.validate()
    card = engine.card
    config.check_fits(card.max_model_len if card else None)
    clock = clock or engine.features.clock or RealClock()
    tag = label or "run"
    result = MultiTurnResult(config, label=label, url=url, model=asdict(card) if card else None)
    await _warm_up(engine, config, tag)
    planned = config.sessions * config.turns
    start = clock.now()
    ends: list[float] = []

    def tick() -> None:
        if on_progress is not None:
            on_progress(MultiTurnTick(label, len(result.records), planned, clock.now() - start))

    async def session(s: int) -> None:
        history: list[ChatMessage] = []
        for turn in range(1, config.turns + 1):
            history.append(ChatMessage("user", message_text(config, tag, s, turn)))
            request = GenerationRequest(
                f"chat-{config.seed}-{tag}-s{s}-t{turn}",
                messages=tuple(history),
                sampling=SamplingSettings(max_tokens=config.output_len, ignore_eos=True),
            )
            sent = clock.now() - start
            record, reply = await _one_turn(engine, request, s, turn, sent)
            result.records.append(record)
            if record.ok:
                ends.append(sent + record.e2e_s)
            tick()
            if not record.ok:
                return  # the next turn needs this reply: the session ends here
            history.append(ChatMessage("assistant", reply))

    tick()
    await asyncio.gather(*(session(s) for s in range(config.sessions)))
    result.records.sort(key=lambda r: (r.session, r.turn))
    # Until the last reply ended (the engine's clock), or now when none did.
    result.duration_s = max(ends) if ends else clock.now() - start
    # Complete only when every planned turn finished: a run whose sessions stopped at a
    # failed turn measured less than it says in its config.
    result.complete = not result.failed and not result.not_sent
    return result


async def _one_turn(
    engine: Engine, request: GenerationRequest, session: int, turn: int, sent_s: float
) -> tuple[TurnRecord, str]:
    """Send one turn; its record, and the reply's text for the next turn's history."""
    parts: list[str] = []
    done: RequestFinished | None = None
    base = TurnRecord(session, turn, request.request_id, sent_s)
    try:
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, RequestFinished):
                done = event
    except KvscopeError as exc:
        return replace(base, error=exc.plain()), ""
    if done is None or done.reason == "abort":
        return replace(base, error="the request was aborted"), ""
    record = replace(
        base,
        ttft_s=done.ttft_s,
        e2e_s=done.e2e_s,
        prompt_tokens=done.prompt_tokens,
        cached_prompt_tokens=cached_tokens(done),
        output_tokens=done.output_tokens,
    )
    return record, "".join(parts)


async def _warm_up(engine: Engine, config: MultiTurnConfig, tag: str) -> None:
    """A fresh engine's first requests pay one-off costs: a few short ones, unmeasured,
    each with a prefix of its own (so they cache nothing a session will use)."""
    for i in range(config.warmup):
        words = random.Random(f"{config.seed}/{tag}/warmup/{i}")
        text = " ".join(words.choice(WORDS) for _ in range(min(config.message_len, 16)))
        request = GenerationRequest(
            f"chat-{config.seed}-{tag}-warmup-{i}",
            messages=(ChatMessage("user", f"warm-up {i}: {text}"),),
            sampling=SamplingSettings(max_tokens=4, ignore_eos=True),
        )
        try:
            async for _ in engine.stream(request):
                pass
        except KvscopeError:
            return  # the run itself will say what is wrong
