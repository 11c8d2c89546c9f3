"""ReplayEngine: a tape plays back the same steps and events, at any speed, with pause and
seek, and with neither vLLM nor torch importable."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest
from subprocess_report import run_and_report
from test_tape import record_fake_session

from engine.clock import RealClock, VirtualClock
from engine.errors import KvscopeError, PromptTooLong
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    RequestAccepted,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)
from engine.fake import FakeConfig, FakeEngine
from engine.replay import ReplayedSend, ReplayEngine, ReplayPosition
from engine.tape import (
    RecordingCutOff,
    RecordingEngine,
    ReplayOnly,
    ReplayRewound,
    Tape,
    TapeNotFound,
    TapeRecorder,
    read_tape,
)


def shifted(event: EngineEvent, offset: float) -> EngineEvent:
    """A live event as a replay with this offset must give it back."""
    if isinstance(event, TokenEvent):
        return dataclasses.replace(event, time_s=event.time_s + offset)
    if isinstance(event, RequestAccepted):
        return dataclasses.replace(event, submitted_at=event.submitted_at + offset)
    return event


class Player:
    """A consumer like the app: streams every request the replay sends, keeps it all."""

    def __init__(self, replay: ReplayEngine) -> None:
        self.replay = replay
        self.steps: list[StepSample] = []
        self.events: dict[str, list[EngineEvent]] = {}
        self.errors: dict[str, KvscopeError] = {}
        self.sends: list[ReplayedSend] = []
        self.tasks: list[asyncio.Task[None]] = []
        replay.add_step_listener(self.steps.append)
        replay.add_send_listener(self.on_send)

    def on_send(self, send: ReplayedSend) -> None:
        self.sends.append(send)
        for request in send.requests:
            self.tasks.append(asyncio.ensure_future(self.consume(request)))

    async def consume(self, request: GenerationRequest) -> None:
        got = self.events.setdefault(request.request_id, [])
        try:
            async for event in self.replay.stream(request):
                got.append(event)
        except KvscopeError as exc:
            self.errors[request.request_id] = exc

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks)


async def play(tape: Tape | Path, start: float = 0.0, **options: object) -> Player:
    clock = VirtualClock(start)
    replay = ReplayEngine(tape, clock=clock, **options)  # type: ignore[arg-type]
    player = Player(replay)
    replay.start()
    await replay.run()
    await player.finish()
    return player


@pytest.fixture(scope="module")
def fake_tape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "fake.jsonl"
    record_fake_session(path)
    return path


# -- the real engine: what was live is what replays ------------------------------------------


async def test_replay_gives_back_the_live_session_of_the_real_engine(
    vllm_engine: object, tmp_path: Path
) -> None:
    inner = vllm_engine
    path = tmp_path / "live.jsonl"
    engine = RecordingEngine(inner, TapeRecorder(path))  # type: ignore[arg-type]
    live_steps: list[StepSample] = []
    remove = engine.add_step_listener(live_steps.append)
    live: dict[str, list[EngineEvent]] = {}

    async def run(request: GenerationRequest, abort_at: int | None = None) -> None:
        got = live.setdefault(request.request_id, [])
        async for event in engine.stream(request):
            got.append(event)
            late = isinstance(event, TokenEvent) and event.index >= (abort_at or 1 << 30)
            if abort_at is not None and late:
                engine.abort(request.request_id)

    try:
        chat = (ChatMessage("user", "Name one colour."),)
        engine.record_user_message("Name one colour.", request_ids=["tape-chat"])
        await run(
            GenerationRequest("tape-chat", messages=chat, sampling=SamplingSettings(max_tokens=8))
        )
        prompt = engine.synthetic_prompt(300, "What is a KV cache?")
        engine.record_user_message("What is a KV cache?", request_ids=["tape-synth"])
        walk = SamplingSettings(max_tokens=10, ignore_eos=True)
        await run(GenerationRequest("tape-synth", prompt_token_ids=prompt, sampling=walk))
        engine.record_user_message("stop", request_ids=["tape-abort"])
        long_walk = SamplingSettings(max_tokens=300, ignore_eos=True)
        prompt = engine.synthetic_prompt(200, seed=7)
        await run(
            GenerationRequest("tape-abort", prompt_token_ids=prompt, sampling=long_walk),
            abort_at=3,
        )
    finally:
        remove()
        engine.close_tape()  # the shared engine goes on for the other tests

    tape = read_tape(path)
    assert tape.warnings == ()
    assert tape.end is not None
    assert [r.request_id for r in tape.requests] == ["tape-chat", "tape-synth", "tape-abort"]
    finished = live["tape-abort"][-1]
    assert isinstance(finished, RequestFinished)
    assert finished.reason == "abort"

    player = await play(tape)
    offset = player.replay.offset
    assert offset == -tape.entries[0].at  # a VirtualClock from 0: the tape starts at 0
    # Every step, each at its live time re-based, and in the same order.
    assert player.steps == [
        dataclasses.replace(s, started_at=s.started_at + offset) for s in live_steps
    ]
    for rid, events in live.items():
        assert player.events[rid] == [shifted(e, offset) for e in events], rid
    tokens = [e for e in player.events["tape-synth"] if isinstance(e, TokenEvent)]
    assert len(tokens) == 10
    assert tokens[0].time_s > 0
    assert [s.message.text for s in player.sends if s.message] == [
        "Name one colour.",
        "What is a KV cache?",
        "stop",
    ]


# -- no vLLM, no torch ----------------------------------------------------------------------

NO_ENGINE_SCRIPT = r"""
import sys
sys.modules["vllm"] = None
sys.modules["torch"] = None
import asyncio, json
from engine.clock import VirtualClock
from engine.replay import ReplayEngine
from engine.tape import read_tape

async def main():
    replay = ReplayEngine(read_tape(sys.argv[1]), clock=VirtualClock())
    steps, tokens, tasks = [], [], []

    async def consume(request):
        try:
            async for event in replay.stream(request):
                tokens.append(getattr(event, "token_ids", ()))
        except Exception as exc:
            tokens.append(type(exc).__name__)

    replay.add_step_listener(steps.append)
    replay.add_send_listener(
        lambda send: tasks.extend(asyncio.ensure_future(consume(r)) for r in send.requests)
    )
    replay.start()
    await replay.run()
    await asyncio.gather(*tasks)
    loaded = [m for m in ("vllm", "torch", "transformers") if sys.modules.get(m) is not None]
    print("REPORT" + json.dumps({"steps": len(steps), "events": len(tokens), "loaded": loaded}))

asyncio.run(main())
"""


def test_replay_needs_neither_vllm_nor_torch(fake_tape: Path) -> None:
    tape = read_tape(fake_tape)
    report = run_and_report(
        NO_ENGINE_SCRIPT.replace("sys.argv[1]", repr(str(fake_tape))),
        "REPORT",
        timeout=60,
        fresh=True,  # a zygote's fork has vLLM imported already
    )
    assert report["loaded"] == []
    assert report["steps"] == len(tape.steps) > 0
    assert report["events"] >= tape.output_tokens


# -- pause, seek, step, end -----------------------------------------------------------------


async def test_pause_step_seek_rewind_and_the_end(fake_tape: Path) -> None:
    tape = read_tape(fake_tape)
    replay = ReplayEngine(tape, clock=VirtualClock(), paused=True)
    player = Player(replay)
    positions: list[ReplayPosition] = []
    rewinds: list[int] = []
    replay.add_position_listener(positions.append)
    replay.add_rewind_listener(rewinds.append)
    replay.start()
    runner = asyncio.ensure_future(replay.run(hold_at_end=True))
    for _ in range(20):
        await asyncio.sleep(0)
    assert replay.position == 0
    assert player.steps == []
    assert not runner.done()

    assert replay.step_once() == 1
    assert [s.step for s in player.steps] == [tape.steps[0].step]
    assert player.sends
    assert player.sends[0].message is not None
    assert replay.seek(10) == 10
    assert [s.step for s in player.steps] == [s.step for s in tape.steps[:10]]
    assert positions[-1].position == 10
    assert positions[-1].paused
    await asyncio.sleep(0)
    first = player.tasks[0]
    assert not first.done()  # its reply is still streaming at step 10

    # Back to step 5: the consumer is told, open streams end, and steps 1-5 come again.
    assert replay.seek(5) == 5
    assert rewinds == [5]
    for _ in range(5):
        await asyncio.sleep(0)
    assert first.done()
    assert isinstance(player.errors.get("r1"), ReplayRewound)
    assert [s.step for s in player.steps[10:]] == [s.step for s in tape.steps[:5]]
    for _ in range(20):
        await asyncio.sleep(0)
    assert replay.position == 5  # still paused

    replay.resume()
    while not replay.ended:  # noqa: ASYNC110  (the replay's own state, polled per loop turn)
        await asyncio.sleep(0)
    assert replay.position == replay.length == len(tape.steps)
    assert positions[-1].ended
    assert positions[-1].position == replay.length
    assert not runner.done()  # held at the end: a seek back plays on
    replay.seek(0)
    assert replay.position == 0
    assert not replay.ended
    assert rewinds == [5, 0]
    replay.shutdown()
    await asyncio.wait_for(runner, 5)
    await player.finish()


async def test_what_each_request_did_replays_as_it_was(fake_tape: Path) -> None:
    tape = read_tape(fake_tape)
    player = await play(tape, start=1000.0)
    assert player.replay.ended
    assert player.replay.position == len(tape.steps)
    offset = player.replay.offset
    assert offset == 1000.0 - tape.entries[0].at  # the tape starts at the clock's now()
    assert player.steps == [
        dataclasses.replace(s, started_at=s.started_at + offset) for s in tape.steps
    ]
    for recorded_request in tape.requests:
        rid = recorded_request.request_id
        expected = [shifted(e, offset) for e in recorded_request.events]
        assert player.events[rid][: len(expected)] == expected, rid
    assert [len(s.requests) for s in player.sends] == [1, 3, 1, 1, 1, 1]
    # An abort, a refusal with its own type and words, and a stream the live consumer
    # walked away from, which a replay's consumer sees end as aborted.
    aborted = player.events["r3"][-1]
    assert isinstance(aborted, RequestFinished)
    assert aborted.reason == "abort"
    refused = player.errors["r4"]
    assert isinstance(refused, PromptTooLong)
    assert refused.prompt_tokens == 600
    walked = player.events["r5"][-1]
    assert isinstance(walked, RequestFinished)
    assert walked.reason == "abort"
    recorded = {r.request_id: r for r in tape.requests}["r5"]
    assert walked.output_tokens == len(recorded.tokens) > 0


async def test_a_reply_the_tape_cuts_off_ends_marked_interrupted(
    fake_tape: Path, tmp_path: Path
) -> None:
    data = fake_tape.read_bytes()  # noqa: ASYNC240  (a small file, in a test)
    # Cut the tape just before the 40th token of a copy, as a kill -9 would.
    at = 0
    for _ in range(40):
        at = data.index(b'\n["t","r2.2"', at + 1)
    path = tmp_path / "cut.jsonl"
    path.write_bytes(data[: at + 1])
    tape = read_tape(path)
    assert tape.end is None
    assert tape.warnings == ()
    open_ids = [r.request_id for r in tape.requests if r.status == "interrupted"]
    assert open_ids == ["r2", "r2.2", "r2.3"]
    player = await asyncio.wait_for(play(tape), 10)
    for rid in open_ids:
        error = player.errors[rid]
        assert isinstance(error, RecordingCutOff)
        assert "Interrupted" in error.plain()
        assert "\n" not in error.plain()
    # The copy that was still decoding shows its partial reply, and the count in words.
    tokens = [e for e in player.events["r2.2"] if isinstance(e, TokenEvent)]
    cut = player.errors["r2.2"]
    assert isinstance(cut, RecordingCutOff)
    assert cut.tokens == len(tokens) == 39
    assert "r1" not in player.errors  # a reply that finished before the cut is whole


async def test_speed_changes_the_pace_not_the_latencies(tmp_path: Path) -> None:
    # A short session recorded on a virtual clock: 30 decode steps of 20 ms.
    path = tmp_path / "short.jsonl"
    fake = FakeEngine(FakeConfig(decode_step_s=0.02), VirtualClock())
    engine = RecordingEngine(fake, TapeRecorder(path, clock=fake.clock))
    engine.start()

    async def record() -> list[EngineEvent]:
        request = GenerationRequest(
            "s", prompt_token_ids=fake.synthetic_prompt(32), sampling=SamplingSettings(30)
        )
        return [e async for e in engine.stream(request)]

    live = await record()
    engine.shutdown()
    tape = read_tape(path)
    span = tape.entries[-1].at - tape.entries[0].at
    assert span > 0.5

    replay = ReplayEngine(tape, clock=RealClock(), speed=5.0)
    player = Player(replay)
    replay.start()
    began = time.perf_counter()
    await replay.run()
    await player.finish()
    took = time.perf_counter() - began
    # Never early (sleeps do not end before their time); faster than the tape itself by
    # far, but only bounded by it: a loaded host's sleeps overshoot by any amount.
    assert span / 5 * 0.8 < took < span, (span, took)
    replayed = player.events["s"]
    assert [e.latency_s for e in replayed if isinstance(e, TokenEvent)] == [
        e.latency_s for e in live if isinstance(e, TokenEvent)
    ]
    assert replayed[-1] == live[-1]  # TTFT, ITL and e2e as recorded


async def test_a_long_idle_gap_can_be_shortened(tmp_path: Path) -> None:
    path = tmp_path / "gap.jsonl"
    clock = VirtualClock()
    fake = FakeEngine(FakeConfig(), clock)
    engine = RecordingEngine(fake, TapeRecorder(path, clock=clock))
    engine.start()

    async def record() -> None:
        for k in range(2):
            await clock.sleep(60.0)  # the user reads for a minute
            request = GenerationRequest(
                f"g{k}", prompt_token_ids=fake.synthetic_prompt(16), sampling=SamplingSettings(3)
            )
            async for _ in engine.stream(request):
                pass

    await record()
    engine.shutdown()
    tape = read_tape(path)
    replay = ReplayEngine(tape, clock=RealClock(), speed=1.0, max_gap_s=0.05)
    player = Player(replay)
    replay.start()
    began = time.perf_counter()
    # 2 minutes of tape if the gaps were kept: half of that bounds it on any machine.
    await asyncio.wait_for(replay.run(), 60)
    await player.finish()
    assert time.perf_counter() - began < 60
    second = player.events["g1"][0]
    first = player.events["g0"][0]
    assert isinstance(first, RequestAccepted)
    assert isinstance(second, RequestAccepted)
    assert second.submitted_at - first.submitted_at > 60  # the events keep the real gap


async def test_a_replay_takes_no_new_requests(fake_tape: Path) -> None:
    replay = ReplayEngine(fake_tape, clock=VirtualClock())
    card = replay.start()
    assert card == read_tape(fake_tape).card == replay.card
    request = GenerationRequest("new", messages=(ChatMessage("user", "hi"),))
    with pytest.raises(ReplayOnly) as info:
        async for _ in replay.stream(request):
            pass
    assert "\n" not in info.value.plain()
    assert "--resume" in info.value.plain()
    with pytest.raises(ReplayOnly):
        replay.synthetic_prompt(100)
    with pytest.raises(ReplayOnly):
        replay.chat_prompt_ids(request.messages)
    replay.abort("r1")  # nothing to stop, and no error


def test_start_on_a_missing_tape_is_a_typed_error(tmp_path: Path) -> None:
    replay = ReplayEngine(tmp_path / "missing.jsonl")
    assert replay.card is None
    with pytest.raises(TapeNotFound) as info:
        replay.start()
    assert "missing.jsonl" in info.value.plain()


def test_position_snapshot_reads_as_a_bar(fake_tape: Path) -> None:
    tape = read_tape(fake_tape)
    replay = ReplayEngine(tape, clock=VirtualClock(), paused=True)
    replay.start()
    replay.seek(len(tape.steps) // 2)
    snap = replay.snapshot()
    assert snap.position == len(tape.steps) // 2
    assert snap.length == len(tape.steps)
    assert 0 < snap.time_s < snap.duration_s
    assert snap.paused
    assert not snap.ended
    assert snap.step == tape.steps[snap.position - 1].step
    json.dumps(dataclasses.asdict(snap))  # plain values, for a --json position


# -- the shipped tapes ------------------------------------------------------------------------

SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "tapes"


async def test_the_shipped_tapes_read_and_replay_whole() -> None:
    sweep = read_tape(SHIPPED / "sweep-512-4096.jsonl")
    pool = read_tape(SHIPPED / "kv-pool-preemption.jsonl")
    for tape in (sweep, pool):
        assert tape.warnings == ()
        assert tape.end is not None
        assert tape.end.reason == "closed"
        assert tape.size_bytes < 2 * 1024**2
        assert tape.card is not None
        assert tape.card.device == "cpu"
        assert tape.card.path == tape.card.name  # no folder of the recording machine
        assert all(r.status == "finished" for r in tape.requests)
        player = await play(tape)
        assert player.replay.ended
        assert len(player.steps) == len(tape.steps)
    measured = [r.prompt_tokens for r in sweep.requests][1:]  # after the warm-up
    assert measured == [512, 1024, 2048, 4096]
    assert sum(s.preemptions for s in pool.steps) > 0
    assert max(s.kv_usage for s in pool.steps) == 1.0
    fill = pool.turns()[1]
    assert fill.message is not None
    assert len(fill.requests) == 8
