"""The multi-turn chat workload and its arithmetic, on the fake engine and a virtual clock
(issue #21, item 4): what each turn sends, the summaries per turn, the comparison's
sentence. Deterministic: no wall clock, no server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import TYPE_CHECKING, Literal

import pytest
from rich.console import Console

from bench.multi_turn import (
    MultiTurnConfig,
    MultiTurnResult,
    TurnRecord,
    TurnSummary,
    cached_tokens,
    message_text,
    run_multi_turn,
)
from bench.policy_compare import PolicyComparison, verdict
from cli.load_table import render_multi_turn, render_policy_compare
from engine.clock import VirtualClock
from engine.delegating import DelegatingEngine
from engine.errors import BadOption
from engine.events import (
    GenerationRequest,
    RequestFinished,
    ServerTimings,
)
from engine.fake import REPLY, FakeEngine

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.events import EngineEvent

BLOCK = 16


class Recording(DelegatingEngine):
    """The fake engine, keeping every request it was sent."""

    def __init__(self, inner: FakeEngine) -> None:
        super().__init__(inner)
        self.sent: list[GenerationRequest] = []

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        self.sent.append(request)
        return self.inner.stream(request)


class PrefixFleet(DelegatingEngine):
    """Two pretend replicas with a prefix cache each (whole blocks of prompt tokens), behind
    a pretend router: round robin, or sticky (a session's turns all go where its first went).
    The fake prefills only the tokens not cached, as vLLM does, so hits make TTFT lower."""

    def __init__(self, inner: FakeEngine, policy: Literal["round_robin", "sticky"]) -> None:
        super().__init__(inner)
        self.policy = policy
        self.caches: list[set[tuple[int, ...]]] = [set(), set()]
        self._turns = itertools.count()
        self._home: dict[str, int] = {}
        self.served: list[tuple[str, int, int]] = []  # (request ID, replica, cached)

    def _pick(self, request: GenerationRequest) -> int:
        if self.policy == "round_robin":
            return next(self._turns) % 2
        first = request.messages[0].content
        return self._home.setdefault(first, len(self._home) % 2)

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        return self._stream(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        ids = self.inner.chat_prompt_ids(request.messages)
        replica = self._pick(request)
        cache = self.caches[replica]
        full = len(ids) // BLOCK
        cached = 0
        for k in range(1, full + 1):
            if ids[: k * BLOCK] not in cache:
                break
            cached = k * BLOCK
        cache.update(ids[: k * BLOCK] for k in range(1, full + 1))
        self.served.append((request.request_id, replica, cached))
        rest = ids[cached:] if cached < len(ids) else ids[-1:]
        short = dataclasses.replace(request, messages=(), prompt_token_ids=rest)
        async for event in self.inner.stream(short):
            if isinstance(event, RequestFinished):
                yield dataclasses.replace(
                    event, prompt_tokens=len(ids), cached_prompt_tokens=cached
                )
            else:
                yield event


def _fake() -> FakeEngine:
    fake = FakeEngine(clock=VirtualClock())
    fake.start()
    return fake


def _run(engine: DelegatingEngine, config: MultiTurnConfig, label: str = "") -> MultiTurnResult:
    async def go() -> MultiTurnResult:
        return await run_multi_turn(engine, config, label=label)

    return asyncio.run(go())


def test_each_turn_sends_the_chat_so_far_with_the_replies_as_received() -> None:
    config = MultiTurnConfig(sessions=3, turns=3, message_len=5, output_len=4, seed=7, warmup=0)
    engine = Recording(_fake())
    result = _run(engine, config, label="x")
    assert len(engine.sent) == 9 and len(result.records) == 9 and result.failed == 0
    reply = "".join(f" {w}" if i else w for i, w in enumerate(REPLY[:4]))  # the fake's text
    by_id = {r.request_id: r for r in engine.sent}
    for s in range(3):
        for turn in range(1, 4):
            request = by_id[f"chat-7-x-s{s}-t{turn}"]
            roles = [m.role for m in request.messages]
            assert roles == ["user", "assistant"] * (turn - 1) + ["user"]
            users = [m.content for m in request.messages if m.role == "user"]
            assert users == [message_text(config, "x", s, t) for t in range(1, turn + 1)]
            assert all(len(u.split()) == 5 for u in users)
            assert all(m.content == reply for m in request.messages if m.role == "assistant")
            assert request.sampling.max_tokens == 4 and request.sampling.ignore_eos
    # Every session and turn has its own words; another run tag has others again.
    firsts = {message_text(config, "x", s, 1) for s in range(3)}
    assert len(firsts) == 3 and message_text(config, "y", 0, 1) not in firsts


def test_sessions_run_at_once_and_each_sends_its_next_turn_after_its_last_reply() -> None:
    config = MultiTurnConfig(sessions=2, turns=3, message_len=8, output_len=3, warmup=0)
    result = _run(Recording(_fake()), config)
    assert [(r.session, r.turn) for r in result.records] == [
        (s, t) for s in range(2) for t in range(1, 4)
    ]
    assert [r.sent_s for r in result.records if r.turn == 1] == [0.0, 0.0]  # both at once
    for s in range(2):
        mine = [r for r in result.records if r.session == s]
        for before, after in itertools.pairwise(mine):
            assert after.sent_s >= before.sent_s + before.e2e_s  # closed loop: in order
            assert after.prompt_tokens > before.prompt_tokens  # the chat grows
    assert result.duration_s == max(r.sent_s + r.e2e_s for r in result.records)
    assert result.output_tokens == 6 * 3
    assert result.output_throughput == pytest.approx(18 / result.duration_s)
    assert result.request_throughput == pytest.approx(6 / result.duration_s)


def _rec(
    turn: int, ttft: float | None, prompt: int, cached: int | None, **kw: object
) -> TurnRecord:
    return TurnRecord(0, turn, f"r{turn}", 0.0, ttft, 1.0, prompt, cached, 4, **kw)  # type: ignore[arg-type]


def test_a_summary_is_the_arithmetic_of_its_records() -> None:
    records = [
        _rec(2, 0.1, 100, 50),
        _rec(2, 0.2, 200, 150),
        _rec(2, 0.3, 100, None),  # this engine did not say: left out of the hit rate
        _rec(2, 0.4, 100, 100),
        _rec(2, None, 0, None, error="refused"),
    ]
    s = TurnSummary.of("2", records)
    assert (s.requests, s.failed) == (4, 1)
    assert s.mean_ttft_ms == pytest.approx(250.0)
    assert s.median_ttft_ms == pytest.approx(250.0)
    assert s.p90_ttft_ms == pytest.approx(370.0)  # linear between the 3rd and 4th
    assert s.prompt_tokens == 500
    assert s.cached_prompt_tokens == 300
    assert s.hit_rate == pytest.approx(300 / 400)
    unknown = TurnSummary.of("1", [_rec(1, 0.1, 100, None)])
    assert unknown.cached_prompt_tokens is None and unknown.hit_rate is None
    assert TurnSummary.of("1", [_rec(1, 0.1, 100, 0)]).hit_rate == 0.0


def test_the_cached_count_comes_from_the_engine_or_else_the_servers_usage() -> None:
    done = RequestFinished("r", "length", 100, 4, 0.1, (), 0.2)
    assert cached_tokens(done) is None
    server = ServerTimings(None, None, None, None, None, cached_prompt_tokens=64)
    assert cached_tokens(dataclasses.replace(done, server=server)) == 64
    assert cached_tokens(dataclasses.replace(done, server=server, cached_prompt_tokens=32)) == 32


def _compare() -> tuple[PolicyComparison, dict[str, PrefixFleet]]:
    # Three sessions on two replicas: with two, round robin in lockstep would be sticky too.
    config = MultiTurnConfig(sessions=3, turns=4, message_len=20, output_len=4, seed=3, warmup=0)
    fleets = {"round_robin": PrefixFleet(_fake(), "round_robin")}
    fleets["cache_aware"] = PrefixFleet(_fake(), "sticky")
    out = PolicyComparison(config, {name: f"http://{name}" for name in fleets})
    for name, fleet in fleets.items():
        out.results[name] = _run(fleet, config, label=name)
    return out, fleets


def test_a_sticky_router_finds_each_sessions_last_prompt_cached_round_robin_less() -> None:
    done, fleets = _compare()
    sticky = done.results["cache_aware"]
    for s in range(3):
        mine = [r for r in sticky.records if r.session == s]
        assert mine[0].cached_prompt_tokens == 0
        for before, after in itertools.pairwise(mine):
            # The last prompt, less the fake's 3-token generation prompt, in whole blocks.
            assert after.cached_prompt_tokens == (before.prompt_tokens - 3) // BLOCK * BLOCK
    rr, ca = done.results["round_robin"].later(), sticky.later()
    assert rr is not None and ca is not None
    assert rr.hit_rate is not None and ca.hit_rate is not None
    assert ca.hit_rate > rr.hit_rate  # deterministic here: the fake, not the host
    assert ca.mean_ttft_ms is not None and rr.mean_ttft_ms is not None
    assert ca.mean_ttft_ms < rr.mean_ttft_ms  # the fake prefills only what was not cached
    assert {replica for _, replica, _ in fleets["round_robin"].served} == {0, 1}


def test_the_sentence_says_which_way_it_came_out_with_the_ratio() -> None:
    done, _ = _compare()
    rr, ca = done.results["round_robin"].later(), done.results["cache_aware"].later()
    assert rr is not None and ca is not None and rr.hit_rate is not None
    said = verdict(done)
    assert said.startswith("cache_aware against round_robin: ")
    assert f"prefix hit rate (turns 2-4) {ca.hit_rate:.0%} against {rr.hit_rate:.0%}" in said
    assert ca.mean_ttft_ms is not None and rr.mean_ttft_ms is not None
    ratio = ca.mean_ttft_ms / rr.mean_ttft_ms
    assert f"(x{ratio:.2f}, cache_aware lower)" in said
    assert "so those turns prefilled less" in said
    # The other way round, the same numbers read the other way.
    flipped = PolicyComparison(done.config, dict(reversed(done.urls.items())))
    flipped.results = dict(reversed(done.results.items()))
    said = verdict(flipped)
    assert said.startswith("round_robin against cache_aware: ")
    assert f"(x{1 / ratio:.2f}, round_robin higher)" in said
    assert "cache_aware sent more of each session's turns" in said


def _summary_result(
    label: str, ttft_s: float, cached: int | None, first_ttft_s: float = 1.0
) -> MultiTurnResult:
    config = MultiTurnConfig(sessions=1, turns=2)
    first = _rec(1, first_ttft_s, 100, 0 if cached is not None else None)
    records = [first, _rec(2, ttft_s, 200, cached)]
    return MultiTurnResult(config, label=label, records=records, duration_s=10.0, complete=True)


@pytest.mark.parametrize(
    ("b_ttft", "b_cached", "reads"),
    [
        (0.5, 150, "so those turns prefilled less"),
        (1.0, 150, "but its later turns were not faster"),
        (2.0, 150, "yet a's later turns were faster"),
        (0.5, 100, "routing made no difference to the hits"),
        (0.5, None, "The server did not say how many prompt tokens were cached"),
    ],
)
def test_every_reading_of_the_numbers_is_computed_not_fixed(
    b_ttft: float, b_cached: int | None, reads: str
) -> None:
    a = _summary_result("a", 1.0, 100 if b_cached is not None else None)
    b = _summary_result("b", b_ttft, b_cached)
    done = PolicyComparison(a.config, {"a": "http://a", "b": "http://b"}, {"a": a, "b": b})
    assert reads in verdict(done)
    one = PolicyComparison(a.config, {"a": "http://a", "b": "http://b"}, {"a": a}, {"b": "down"})
    assert verdict(one) == "Fewer than two policies were measured: nothing to compare."


def test_turns_that_nobody_found_cached_are_the_control_the_sentence_reads() -> None:
    urls = {"a": "http://a", "b": "http://b"}
    a = _summary_result("a", 1.0, 100)
    same = PolicyComparison(a.config, urls, {"a": a, "b": _summary_result("b", 0.5, 150)})
    assert "neither found anything cached" not in verdict(same)  # turn 1 alike: no caveat
    quick = _summary_result("b", 0.5, 150, first_ttft_s=0.5)
    faster = PolicyComparison(a.config, urls, {"a": a, "b": quick})
    said = verdict(faster)
    assert "Turns where neither found anything cached (turn 1) were x0.50 under b too" in said
    assert "(b faster): part of the gap is the load balance or the host" in said


def test_the_tables_show_every_turn_every_policy_and_the_sentence() -> None:
    done, _ = _compare()
    console = Console(width=200, record=True)
    render_policy_compare(done, console)
    text = console.export_text()
    for head in ("turn 1", "turn 4", "turns 2+", "prefix hit", "out tok/s", "req/s"):
        assert head in text
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert [row.split("│")[1].strip() for row in rows] == ["round_robin", "cache_aware"]
    assert " ".join(verdict(done).split()) in " ".join(text.split())  # however it wraps
    console = Console(width=200, record=True)
    render_multi_turn(done.results["cache_aware"], console)
    text = console.export_text()
    firsts = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│ ")]
    assert firsts == ["1", "2", "3", "4", "2-4", "all"]


def test_the_json_holds_every_request_and_the_summaries() -> None:
    import json

    done, _ = _compare()
    data = json.loads(done.to_json())
    assert data["kind"] == "multi_turn_compare" and data["seed"] == 3
    assert list(data["policies"]) == ["round_robin", "cache_aware"]
    for name, entry in data["policies"].items():
        assert entry["url"] == f"http://{name}" and entry["complete"] is True
        assert [t["turns"] for t in entry["turns"]] == ["1", "2", "3", "4"]
        assert entry["later_turns"]["turns"] == "2-4"
        assert len(entry["requests"]) == 12
        assert {(r["session"], r["turn"]) for r in entry["requests"]} == {
            (s, t) for s in range(3) for t in range(1, 5)
        }
    assert data["verdict"] == verdict(done)
    rows = done.to_csv().splitlines()
    assert rows[0].startswith("label,session,turn,request_id") and len(rows) == 1 + 24


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (MultiTurnConfig(sessions=0), "--sessions: 0 is not between 1 and 1,024"),
        (MultiTurnConfig(turns=999), "--turns: 999 is not between 1 and 256"),
        (MultiTurnConfig(message_len=0), "--message-len: 0 is not between 1"),
    ],
)
def test_impossible_configs_are_refused_in_words(config: MultiTurnConfig, says: str) -> None:
    with pytest.raises(BadOption) as caught:
        config.validate()
    assert says in caught.value.plain()


def test_a_chat_that_cannot_fit_the_context_is_refused_before_it_runs() -> None:
    engine = Recording(_fake())  # max_model_len 2,048
    config = MultiTurnConfig(turns=20, message_len=100, output_len=32, warmup=0)
    with pytest.raises(BadOption) as caught:
        _run(engine, config)
    said = caught.value.plain()
    assert "20 turns of 100-word messages and 32-token replies reach about 2," in said
    assert "past the context limit (max_model_len) of 2,048" in said
    assert engine.sent == []


def test_a_turn_that_fails_ends_its_session_and_is_counted() -> None:
    class Refusing(Recording):
        def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
            if request.request_id.endswith("-s1-t2"):
                from engine.errors import RequestRejected

                async def refuse() -> AsyncIterator[EngineEvent]:
                    raise RequestRejected(request.request_id, "the server said no")
                    yield  # an async generator

                return refuse()
            return super().stream(request)

    config = MultiTurnConfig(sessions=2, turns=3, message_len=4, output_len=2, warmup=0)
    result = _run(Refusing(_fake()), config)
    assert [(r.session, r.turn, r.ok) for r in result.records] == [
        (0, 1, True), (0, 2, True), (0, 3, True), (1, 1, True), (1, 2, False),
    ]  # fmt: skip
    assert result.failed == 1 and "the server said no" in (result.first_error or "")
    assert TurnSummary.of("2", [r for r in result.records if r.turn == 2]).failed == 1
