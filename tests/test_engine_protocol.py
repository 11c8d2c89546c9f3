"""The Engine protocol, checked with the same assertions on all four engines:

- fake: the FakeEngine, which runs everywhere in milliseconds;
- vllm: the session's shared in-process CPU engine;
- remote: a RemoteEngine on the session's vLLM server on loopback (tests/remote_server.py);
- replay: a tape recorded from a FakeEngine while the test ran, played back.

A test is a scenario (what a consumer does with an engine) and assertions on what the
consumer saw. A replay takes no new requests, so its scenario runs once on the engine that
records the tape, and the assertions read what the replay gives back. An assertion that
needs more than the protocol core asks `features`, never the engine's name.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from engine.clock import VirtualClock
from engine.errors import DuplicateRequestId, KvscopeError, PromptTooLong
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    ModelCard,
    RequestAccepted,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)
from engine.fake import FakeConfig, FakeEngine
from engine.protocol import Engine
from engine.replay import ReplayedSend, ReplayEngine
from engine.sizes import dtype_bytes
from engine.tape import RecordingEngine, TapeRecorder

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator
    from pathlib import Path

    from remote_server import VllmServer

    from engine.features import EngineFeatures
    from engine.vllm.engine import VllmEngine

FAKE = FakeConfig(max_model_len=4096, block_size=16, total_blocks=512)


# -- what a consumer saw -----------------------------------------------------------------------


@dataclass
class Run:
    """One `stream()` call: its events, or the error it raised."""

    request_id: str
    events: list[EngineEvent] = field(default_factory=list)
    error: KvscopeError | None = None

    @property
    def finished(self) -> RequestFinished:
        assert self.error is None, self.error
        last = self.events[-1]
        assert isinstance(last, RequestFinished), self.events[-3:]
        return last

    @property
    def tokens(self) -> list[TokenEvent]:
        return [e for e in self.events if isinstance(e, TokenEvent)]


@dataclass
class Log:
    """Every stream in the order it was called, and every step sample."""

    runs: list[Run] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)

    def of(self, request_id: str) -> list[Run]:
        return [r for r in self.runs if r.request_id == request_id]

    def one(self, request_id: str) -> Run:
        (run,) = self.of(request_id)
        return run

    def begin(self, request_id: str) -> Run:
        run = Run(request_id)
        self.runs.append(run)
        return run

    async def consume(
        self,
        engine: Engine,
        request: GenerationRequest,
        run: Run,
        *,
        abort_at: int | None = None,
        on_event: Callable[[EngineEvent], None] | None = None,
    ) -> Run:
        try:
            async for event in engine.stream(request):
                run.events.append(event)
                if on_event is not None:
                    on_event(event)
                late = isinstance(event, TokenEvent) and event.index >= (abort_at or 1 << 30)
                if abort_at is not None and late:
                    engine.abort(request.request_id)
        except KvscopeError as exc:
            run.error = exc
        return run

    async def stream(
        self,
        engine: Engine,
        request: GenerationRequest,
        *,
        abort_at: int | None = None,
        on_event: Callable[[EngineEvent], None] | None = None,
    ) -> Run:
        run = self.begin(request.request_id)
        return await self.consume(engine, request, run, abort_at=abort_at, on_event=on_event)


# -- the engines under contract --------------------------------------------------------------


class LiveSubject:
    """An engine that takes requests: the scenario runs on it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def features(self) -> EngineFeatures:
        return self.engine.features

    @property
    def card(self) -> ModelCard:
        assert self.engine.card is not None
        return self.engine.card

    async def play(self, scenario: Callable[[Engine, Log], Awaitable[None]]) -> Log:
        log = Log()
        remove = self.engine.add_step_listener(log.samples.append)
        try:
            await scenario(self.engine, log)
        finally:
            remove()
        return log


class ReplaySubject:
    """A replay: the scenario runs on a FakeEngine that records a tape, the tape plays."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._names = itertools.count()
        # A tape of the card alone: what a replay of a fake session says of itself.
        path = self._tape()
        self._recording(path).shutdown()
        self.engine = ReplayEngine(path, clock=VirtualClock())
        self.engine.start()

    @property
    def features(self) -> EngineFeatures:
        return self.engine.features

    @property
    def card(self) -> ModelCard:
        assert self.engine.card is not None
        return self.engine.card

    def _tape(self) -> Path:
        return self.folder / f"contract-{next(self._names)}.jsonl"

    def _recording(self, path: Path) -> RecordingEngine:
        fake = FakeEngine(FAKE)
        engine = RecordingEngine(fake, TapeRecorder(path, clock=fake.features.clock))
        engine.start()
        return engine

    async def play(self, scenario: Callable[[Engine, Log], Awaitable[None]]) -> Log:
        path = self._tape()
        recording = self._recording(path)
        try:
            await scenario(recording, Log())  # what the recording consumer saw: not checked
        finally:
            recording.shutdown()
        replay = ReplayEngine(path, clock=VirtualClock())
        log = Log()
        tasks: list[asyncio.Future[Run]] = []

        def on_send(send: ReplayedSend) -> None:
            # Stream every request the replay sends, as the app does for a user's Enter.
            for request in send.requests:
                run = log.begin(request.request_id)
                tasks.append(asyncio.ensure_future(log.consume(replay, request, run)))

        replay.add_step_listener(log.samples.append)
        replay.add_send_listener(on_send)
        replay.start()
        await replay.run()
        await asyncio.gather(*tasks)
        return log


Subject = LiveSubject | ReplaySubject


@pytest.fixture(scope="module")
def remote_engine(vllm_server: VllmServer) -> Iterator[Engine]:
    from remote_server import API_KEY

    from engine.remote import RemoteEngine

    # No KV events: only one engine at a time may listen (test_remote_engine.py's does).
    engine = RemoteEngine(vllm_server.url, api_key=API_KEY, kv_events=None)
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture(
    params=[
        "fake",
        pytest.param("vllm", marks=pytest.mark.engine),
        # The same engine on the path CUDA takes by default: batches kept in flight, each
        # step handing out the previous batch's tokens (see test_vllm_batch_queue.py).
        pytest.param("vllm-batch-queue", marks=pytest.mark.engine),
        # And with vLLM's own AsyncScheduler in that queue, as CUDA runs by default.
        pytest.param("vllm-async", marks=pytest.mark.engine),
        pytest.param("remote", marks=pytest.mark.engine),
        "replay",
    ]
)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "fake":
        fake = FakeEngine(FAKE)
        fake.start()
        yield LiveSubject(fake)
    elif request.param == "replay":
        yield ReplaySubject(tmp_path)
    elif request.param in ("vllm-batch-queue", "vllm-async"):
        from engine_hooks import scheduling

        vllm: VllmEngine = request.getfixturevalue("vllm_engine")
        with scheduling(vllm, request.param.removeprefix("vllm-")):
            yield LiveSubject(vllm)
    else:
        fixture = "vllm_engine" if request.param == "vllm" else "remote_engine"
        engine: Engine = request.getfixturevalue(fixture)
        yield LiveSubject(engine)


def needs_exact_steps(subject: Subject) -> None:
    if not subject.features.exact_steps:
        pytest.skip("its samples are not scheduler steps: they carry no blocks per request")


def makes_prompts(subject: Subject) -> None:
    if subject.features.replay is not None:
        pytest.skip("a replay makes no prompts: it plays the ones on its tape")


_counter = itertools.count(1)


def _rid(tag: str) -> str:
    return f"{tag}-{next(_counter)}"


def walk(n: int) -> SamplingSettings:
    return SamplingSettings(max_tokens=n, ignore_eos=True)


# -- the contract --------------------------------------------------------------------------------


def test_satisfies_protocol(subject: Subject) -> None:
    assert isinstance(subject.engine, Engine)
    card = subject.card
    assert card.total_blocks > 0
    assert card.block_size > 0
    # K and V x layers x KV heads x head_dim x the dtype's bytes (float32 in the session's
    # engine, bf16 in the fake). A remote card knows no geometry (all 0): the product is 0 too.
    per_element = dtype_bytes(card.dtype)
    assert card.kv_bytes_per_token == (
        2 * card.num_layers * card.num_kv_heads * card.head_dim * per_element
    )


def test_synthetic_prompt_is_exact(subject: Subject) -> None:
    makes_prompts(subject)
    engine = subject.engine
    for n in (1, 5, 64, 300, 1000):
        assert len(engine.synthetic_prompt(n)) == n
    with_text = engine.synthetic_prompt(200, suffix="What is a KV cache?")
    assert len(with_text) == 200
    assert engine.synthetic_prompt(100, seed=1) != engine.synthetic_prompt(100, seed=2)


async def test_tokens_stream_with_one_itl_per_token_after_the_first(subject: Subject) -> None:
    rid = _rid("stream")

    async def scenario(engine: Engine, log: Log) -> None:
        prompt = engine.synthetic_prompt(64)
        await log.stream(engine, GenerationRequest(rid, prompt_token_ids=prompt, sampling=walk(12)))

    run = (await subject.play(scenario)).one(rid)
    accepted = run.events[0]
    assert isinstance(accepted, RequestAccepted)
    assert accepted.prompt_tokens == 64
    finished = run.finished
    tokens = run.tokens
    assert finished.reason == "length"
    assert finished.output_tokens == 12 == sum(len(t.token_ids) for t in tokens)
    assert len(finished.itl_s) == finished.output_tokens - 1
    assert finished.ttft_s is not None
    assert finished.ttft_s > 0
    assert tokens[0].latency_s == pytest.approx(finished.ttft_s)  # stamped from stream()
    steps = [t.step for t in tokens]
    assert steps == sorted(steps)
    assert len(set(steps)) == len(steps)
    assert all(t.latency_s >= 0 for t in tokens)
    # Each event starts where the tokens before it ended (a chunk may carry several).
    starts = itertools.accumulate((len(t.token_ids) for t in tokens[:-1]), initial=0)
    assert [t.index for t in tokens] == list(starts)


async def test_chat_messages_go_through_the_template(subject: Subject) -> None:
    rid = _rid("chat")
    messages = (ChatMessage("user", "Name one colour."),)
    template: list[int] = []

    async def scenario(engine: Engine, log: Log) -> None:
        template.extend(engine.chat_prompt_ids(messages))
        request = GenerationRequest(rid, messages=messages, sampling=SamplingSettings(8))
        await log.stream(engine, request)

    run = (await subject.play(scenario)).one(rid)
    assert len(template) > 3
    accepted = run.events[0]
    assert isinstance(accepted, RequestAccepted)
    assert accepted.prompt_tokens == len(template)
    assert run.finished.prompt_tokens == len(template)


async def test_too_long_prompt_is_typed_and_the_engine_goes_on(subject: Subject) -> None:
    limit = subject.card.max_model_len
    # max_model_len itself is one too many: the reply needs a token of the context.
    too_long = {_rid("long"): limit, _rid("long"): limit + 1}
    after = _rid("after")

    async def scenario(engine: Engine, log: Log) -> None:
        for rid, n in too_long.items():
            request = GenerationRequest(rid, prompt_token_ids=(1000,) * n, sampling=walk(4))
            await log.stream(engine, request)
        prompt = engine.synthetic_prompt(32)
        await log.stream(
            engine, GenerationRequest(after, prompt_token_ids=prompt, sampling=walk(4))
        )

    log = await subject.play(scenario)
    for rid, n in too_long.items():
        run = log.one(rid)
        assert run.events == []  # raised before any event
        assert isinstance(run.error, PromptTooLong)
        assert (run.error.prompt_tokens, run.error.max_model_len) == (n, limit)
        assert f"{n:,}" in run.error.plain()
    assert log.one(after).finished.output_tokens == 4


async def test_a_duplicate_request_id_is_refused_before_any_event(subject: Subject) -> None:
    rid = _rid("twice")

    async def scenario(engine: Engine, log: Log) -> None:
        prompt = engine.synthetic_prompt(48)
        first_token = asyncio.Event()

        def seen(event: EngineEvent) -> None:
            if isinstance(event, TokenEvent):
                first_token.set()

        first = asyncio.ensure_future(
            log.stream(
                engine,
                GenerationRequest(rid, prompt_token_ids=prompt, sampling=walk(24)),
                on_event=seen,
            )
        )
        await first_token.wait()
        again = GenerationRequest(rid, prompt_token_ids=prompt, sampling=walk(4))
        await log.stream(engine, again)  # while the first is still streaming
        await first
        await log.stream(engine, again)  # after it ended, the ID is free

    log = await subject.play(scenario)
    first, refused, later = log.of(rid)
    assert refused.events == []
    assert isinstance(refused.error, DuplicateRequestId)
    assert refused.error.request_id == rid
    assert repr(rid) in refused.error.plain()
    # The refusal touched nothing of the first request.
    assert first.finished.reason == "length"
    assert first.finished.output_tokens == 24
    assert later.finished.output_tokens == 4


async def test_abort_frees_the_requests_blocks(subject: Subject) -> None:
    needs_exact_steps(subject)
    block_size = subject.card.block_size
    rid, probe = _rid("abort"), _rid("probe")

    async def scenario(engine: Engine, log: Log) -> None:
        prompt = engine.synthetic_prompt(block_size * 2 + 5)
        request = GenerationRequest(rid, prompt_token_ids=prompt, sampling=walk(500))
        await log.stream(engine, request, abort_at=3)
        tiny = GenerationRequest(
            probe, prompt_token_ids=engine.synthetic_prompt(8), sampling=walk(2)
        )
        await log.stream(engine, tiny)

    log = await subject.play(scenario)
    finished = log.one(rid).finished
    assert finished.reason == "abort"
    assert finished.output_tokens < 500
    held = [b for s in log.samples for b in s.blocks if b.request_id == rid]
    assert held
    assert len(held[-1].block_ids) == 3
    # The request after the abort sees the whole pool free except its own block.
    after = [s for s in log.samples if any(b.request_id == probe for b in s.blocks)]
    assert after
    assert all(b.request_id != rid for s in after for b in s.blocks)
    assert after[0].free_blocks == after[0].total_blocks - 1


async def test_block_count_follows_the_tokens(subject: Subject) -> None:
    needs_exact_steps(subject)
    bs = subject.card.block_size
    prompt = 2 * bs - 6  # crosses into a third block after a few decode steps
    rid = _rid("blocks")

    async def scenario(engine: Engine, log: Log) -> None:
        ids = engine.synthetic_prompt(prompt)
        await log.stream(engine, GenerationRequest(rid, prompt_token_ids=ids, sampling=walk(12)))

    log = await subject.play(scenario)
    mine = [b for s in log.samples for b in s.blocks if b.request_id == rid]
    assert mine, "no step reported the request's blocks"
    for held in mine:
        assert len(held.block_ids) == math.ceil(held.num_tokens / bs), held
        assert len(set(held.block_ids)) == len(held.block_ids)
    counts = [h.num_tokens for h in mine]
    assert counts[0] == prompt
    assert counts == list(range(prompt, prompt + len(counts)))
    assert {len(h.block_ids) for h in mine} == {2, 3}


async def test_concurrent_requests_hold_separate_blocks(subject: Subject) -> None:
    needs_exact_steps(subject)
    ids = [_rid("pair"), _rid("pair")]

    async def scenario(engine: Engine, log: Log) -> None:
        requests = [
            GenerationRequest(
                rid, prompt_token_ids=engine.synthetic_prompt(100, seed=i), sampling=walk(6)
            )
            for i, rid in enumerate(ids)
        ]
        await asyncio.gather(*(log.stream(engine, r) for r in requests))

    log = await subject.play(scenario)
    both = [s for s in log.samples if {b.request_id for b in s.blocks} >= set(ids)]
    assert both, "the two requests never ran in the same step"
    a, b = (next(x for x in both[0].blocks if x.request_id == rid) for rid in ids)
    assert not set(a.block_ids) & set(b.block_ids)
    assert both[0].running >= 2
