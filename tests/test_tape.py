"""Session tapes: the format round-trips every event, a kill -9 loses at most a step, and
every bad file says what is wrong in one line. No vLLM here: the FakeEngine records."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.clock import VirtualClock
from engine.errors import KvscopeError, PromptTooLong
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    RequestFinished,
    RequestWork,
    SamplingSettings,
    ServerTimings,
    StepSample,
    TokenEvent,
    TtftAnatomy,
    VllmTimings,
)
from engine.fake import FakeConfig, FakeEngine
from engine.tape import (
    NotATape,
    RecordingEngine,
    TapeCorrupt,
    TapeEmpty,
    TapeNotFound,
    TapeRecorder,
    TapeTooNew,
    TapeUnwritable,
    TornLastLine,
    default_tape_path,
    latest_tape,
    read_tape,
)
from engine.tape.format import Decoder, Encoder, dumps

ROOT = Path(__file__).resolve().parents[1]

# Small enough that three 300-token copies fill the pool and one is preempted.
SMALL_POOL = FakeConfig(max_model_len=512, block_size=16, total_blocks=48)


@dataclasses.dataclass
class Session:
    path: Path
    steps: list[StepSample]
    events: dict[str, list[EngineEvent]]
    errors: dict[str, KvscopeError]


async def play_fake_session(engine: RecordingEngine, fake: FakeEngine) -> Session:
    """A chat turn, three copies that preempt, an abort, a refused prompt, an abandoned
    stream after a new chat: everything a tape must carry."""
    steps: list[StepSample] = []
    remove = engine.add_step_listener(steps.append)
    events: dict[str, list[EngineEvent]] = {}
    errors: dict[str, KvscopeError] = {}

    async def run(request: GenerationRequest, *, abort_at: int | None = None) -> None:
        got = events.setdefault(request.request_id, [])
        try:
            async for event in engine.stream(request):
                got.append(event)
                late = isinstance(event, TokenEvent) and event.index >= (abort_at or 1 << 30)
                if abort_at is not None and late:
                    engine.abort(request.request_id)
        except KvscopeError as exc:
            errors[request.request_id] = exc

    chat = (ChatMessage("user", "What is a KV cache?"),)
    engine.record_user_message("What is a KV cache?", request_ids=["r1"])
    await run(GenerationRequest("r1", messages=chat, sampling=SamplingSettings(max_tokens=12)))
    copies = ["r2", "r2.2", "r2.3"]
    engine.record_user_message("fill it", request_ids=copies, synthetic_tokens=300)
    walk = SamplingSettings(max_tokens=120, ignore_eos=True)
    await asyncio.gather(
        *[
            run(
                GenerationRequest(
                    rid, prompt_token_ids=fake.synthetic_prompt(300, seed=k), sampling=walk
                )
            )
            for k, rid in enumerate(copies)
        ]
    )
    engine.record_user_message("stop me", request_ids=["r3"])
    await run(
        GenerationRequest("r3", prompt_token_ids=fake.synthetic_prompt(40), sampling=walk),
        abort_at=4,
    )
    engine.record_user_message("too long", request_ids=["r4"], synthetic_tokens=600)
    await run(GenerationRequest("r4", prompt_token_ids=fake.synthetic_prompt(600), sampling=walk))
    # The consumer walks away mid-reply (a new chat), then one more chat turn.
    engine.record_user_message("walk away", request_ids=["r5"])
    gen = engine.stream(
        GenerationRequest("r5", prompt_token_ids=fake.synthetic_prompt(40), sampling=walk)
    )
    walked = events.setdefault("r5", [])
    async for event in gen:
        walked.append(event)
        if isinstance(event, TokenEvent) and event.index >= 2:
            break
    await gen.aclose()  # type: ignore[attr-defined]
    engine.record_new_chat()
    chat2 = (ChatMessage("user", "Hello again"),)
    engine.record_user_message("Hello again", request_ids=["r6"])
    await run(GenerationRequest("r6", messages=chat2, sampling=SamplingSettings(max_tokens=5)))
    remove()
    return Session(engine.recorder.path, steps, events, errors)


def record_fake_session(path: Path, config: FakeConfig = SMALL_POOL) -> Session:
    fake = FakeEngine(config, VirtualClock())
    engine = RecordingEngine(fake, TapeRecorder(path, clock=fake.features.clock))
    engine.start()
    session = asyncio.run(play_fake_session(engine, fake))
    engine.shutdown()
    return session


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return record_fake_session(tmp_path_factory.mktemp("tape") / "session.jsonl")


# -- the round trip ----------------------------------------------------------------------------


def test_every_step_and_event_reads_back_exactly(recorded: Session) -> None:
    tape = read_tape(recorded.path)
    assert tape.warnings == ()
    assert tape.end is not None
    assert tape.end.reason == "closed"
    assert list(tape.steps) == recorded.steps
    assert sum(s.preemptions for s in tape.steps) >= 1, "the session should preempt"
    assert any(s.idle for s in tape.steps)  # a field added after the format: still taped
    by_id = {r.request_id: r for r in tape.requests}
    for rid, events in recorded.events.items():
        assert list(by_id[rid].events) == events, rid
    assert tape.card is not None
    assert tape.card.total_blocks == SMALL_POOL.total_blocks


def test_how_each_request_ended_is_kept(recorded: Session) -> None:
    tape = read_tape(recorded.path)
    by_id = {r.request_id: r for r in tape.requests}
    assert by_id["r1"].status == "finished"
    assert by_id["r1"].request.messages[0].content
    finished = by_id["r3"].finished
    assert finished is not None
    assert finished.reason == "abort"
    failure = by_id["r4"].failure
    assert failure is not None
    assert isinstance(failure.error, PromptTooLong)
    assert failure.error.plain() == recorded.errors["r4"].plain()
    assert by_id["r5"].status == "abandoned"
    assert by_id["r5"].text
    assert by_id["r2"].prompt_tokens == 300
    assert by_id["r2"].prompt_ids_len == 300


def test_turns_group_copies_and_a_new_chat_starts_over(recorded: Session) -> None:
    tape = read_tape(recorded.path)
    turns = tape.turns()
    assert [t.message.text for t in turns if t.message] == [
        "What is a KV cache?",
        "fill it",
        "stop me",
        "too long",
        "walk away",
        "Hello again",
    ]
    fill = turns[1]
    assert fill.message is not None
    assert fill.message.synthetic_tokens == 300
    assert [r.request_id for r in fill.requests] == ["r2", "r2.2", "r2.3"]
    last = tape.last_chat()
    assert len(last) == 1
    assert last[0].requests[0].request_id == "r6"
    history = tape.chat_history()
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[0].content == "Hello again"
    assert history[1].content == last[0].requests[0].text


def test_block_ids_are_written_only_when_they_change(recorded: Session) -> None:
    lines = recorded.path.read_text().splitlines()[1:]
    steps = [json.loads(x) for x in lines if x.startswith('["s"')]
    entries = [b for s in steps for b in s[12]]
    unchanged = sum(1 for b in entries if b[2] is None)
    # Most steps are decode steps that keep every request's blocks.
    assert unchanged > 0.7 * len(entries), (unchanged, len(entries))


def test_extra_fields_and_timings_round_trip() -> None:
    encoder, decoder = Encoder(), Decoder()
    token = TokenEvent("a", 0, (5, 6), "hi", 3, 10.5, 0.25)
    server = ServerTimings(0.1, 0.02, 0.0, 1.5, 40.0, cached_prompt_tokens=16)
    finished = RequestFinished("a", "stop", 7, 2, 0.3, (0.0,), 0.3, 1, server=server)
    work = (RequestWork("a", 7, 0), RequestWork("c", 0, 1))
    sample = StepSample(3, 10.0, 0.5, 7, 1, 2, 1, 0.25, 3, 4, 16, work=work, waiting_ids=("b",))
    idle = dataclasses.replace(sample, work=(), waiting_ids=(), idle=True)
    anatomy = TtftAnatomy(0.1, 0.15, 2, 0.05, 0.0)
    vllm = VllmTimings(0.29, (0.0,), 0.1, 0.2, 0.01)
    full = dataclasses.replace(finished, request_id="d", anatomy=anatomy, vllm=vllm)
    for kind, value in (
        ("step", sample),
        ("step", idle),
        ("event", token),
        ("event", finished),
        ("event", full),
    ):
        rec = json.loads(dumps(encoder.encode(kind, value, 11.0)))  # type: ignore[arg-type]
        assert decoder.decode(rec)[0] == value
    # itl_s that is not the token gaps is written out, not dropped.
    odd = dataclasses.replace(finished, request_id="b", itl_s=(0.125,))
    rec = json.loads(dumps(encoder.encode("event", odd, 12.0)))
    assert rec[7] == [0.125]
    assert decoder.decode(rec)[0] == odd


# -- crashes and caps --------------------------------------------------------------------------

KILL_SCRIPT = r"""
import asyncio, sys
from engine.clock import RealClock
from engine.events import ChatMessage, GenerationRequest, SamplingSettings
from engine.fake import FakeConfig, FakeEngine
from engine.tape import record

async def main() -> None:
    fake = FakeEngine(FakeConfig(decode_step_s=0.02), RealClock())
    engine = record(fake, sys.argv[1])
    engine.start()
    engine.add_step_listener(lambda s: print("STEP", s.step, flush=True))
    engine.record_user_message("Tell me everything.", request_ids=["long"])
    request = GenerationRequest(
        "long",
        messages=(ChatMessage("user", "Tell me everything."),),
        sampling=SamplingSettings(max_tokens=100000, ignore_eos=True),
    )
    async for _ in engine.stream(request):
        pass

asyncio.run(main())
"""


def test_kill_9_mid_reply_loses_at_most_the_last_step(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = 0
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        seen = int(line.split()[1])
        if seen >= 40 or time.monotonic() > deadline:
            break
    assert seen >= 40

    def steps_on_disk() -> int:
        """Steps in the tape's whole lines so far (a line being written is left off)."""
        data = path.read_bytes()
        so_far = tmp_path / "so-far.jsonl"
        so_far.write_bytes(data[: data.rfind(b"\n") + 1])
        return len(read_tape(so_far).steps)

    # The writer is a thread of its own and a loaded host may hold it back a few steps:
    # it is waited for until all but the step in flight (printed after it was handed to
    # the writer) are on disk. A writer that kept them in memory never gets there.
    deadline = time.monotonic() + 60
    while (written := steps_on_disk()) < seen - 1:
        assert time.monotonic() < deadline, f"{written} steps on disk, {seen} taken"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    tape = read_tape(path)
    numbers = [s.step for s in tape.steps]
    # Every step written before the kill survives it, none missing.
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= written, (len(numbers), written, seen)
    assert tape.end is None  # no end line: the recording was cut off
    (request,) = tape.requests
    assert request.status == "interrupted"
    assert request.message is not None
    tokens = request.tokens
    assert tokens
    assert [t.index for t in tokens] == list(range(len(tokens)))
    assert tokens[-1].step >= numbers[-1] - 1
    # What --resume puts back: the question, and the partial reply, marked interrupted.
    (turn,) = tape.last_chat()
    assert turn.requests[0].status == "interrupted"
    user, partial = tape.chat_history()
    assert user == ChatMessage("user", "Tell me everything.")
    assert partial.role == "assistant"
    assert partial.content == request.text != ""


def test_size_cap_ends_recording_with_a_notice(tmp_path: Path) -> None:
    path = tmp_path / "capped.jsonl"
    notices: list[str] = []
    fake = FakeEngine(FakeConfig(), VirtualClock())
    cap = 8 * 1024
    recorder = TapeRecorder(path, clock=fake.clock, cap_bytes=cap, on_notice=notices.append)
    engine = RecordingEngine(fake, recorder)
    engine.start()

    async def go() -> RequestFinished:
        request = GenerationRequest(
            "big",
            prompt_token_ids=fake.synthetic_prompt(64),
            sampling=SamplingSettings(max_tokens=400, ignore_eos=True),
        )
        events = [e async for e in engine.stream(request)]
        assert isinstance(events[-1], RequestFinished)
        return events[-1]

    finished = asyncio.run(go())
    assert finished.output_tokens == 400  # the session went on
    engine.shutdown()
    assert path.stat().st_size <= cap
    assert len(notices) == 1
    assert "size cap" in notices[0]
    assert "8.0 KiB" not in notices[0]
    assert recorder.notice == notices[0]
    assert "\n" not in notices[0]
    tape = read_tape(path)
    assert tape.end is not None
    assert tape.end.reason == "cap"
    assert tape.warnings == ()
    assert 0 < len(tape.steps) < 400


def test_unwritable_path_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(TapeUnwritable) as info:
        TapeRecorder(blocker / "tape.jsonl")
    assert str(blocker) in info.value.plain()
    assert "\n" not in info.value.plain()


def test_default_path_is_under_the_tape_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_TAPE_DIR", str(tmp_path / "tapes"))
    assert latest_tape() is None
    first = default_tape_path(0.0)
    assert first.parent == tmp_path / "tapes"
    assert first.suffix == ".jsonl"
    recorder = TapeRecorder()
    recorder.close()
    assert recorder.path.parent == tmp_path / "tapes"
    assert latest_tape() == recorder.path
    # A second tape in the same second gets its own name.
    assert default_tape_path() != recorder.path


def test_default_folder_is_platformdirs_user_data(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    from engine.tape import tapes_dir

    monkeypatch.delenv("KVSCOPE_TAPE_DIR", raising=False)
    assert tapes_dir() == Path(platformdirs.user_data_dir("kvscope")) / "tapes"


# -- bad files ---------------------------------------------------------------------------------


def _one_line(error: KvscopeError, path: Path) -> str:
    words = error.plain()
    assert "\n" not in words
    assert str(path) in words
    assert "Traceback" not in words
    return words


def test_torn_last_line_is_skipped_with_a_warning(recorded: Session, tmp_path: Path) -> None:
    data = recorded.path.read_bytes()
    # Cut the tape in the middle of a step line, as a kill during a write would.
    cut = data.rindex(b'\n["s"', 0, len(data) // 2) + 20
    path = tmp_path / "torn.jsonl"
    path.write_bytes(data[:cut])
    tape = read_tape(path)
    (warning,) = tape.warnings
    assert isinstance(warning, TornLastLine)
    words = _one_line(warning, path)
    assert "skipped" in words
    assert f"{len(tape.steps):,} steps" in words
    whole = read_tape(recorded.path)
    assert tape.steps == whole.steps[: len(tape.steps)]
    assert tape.end is None


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(TapeEmpty) as info:
        read_tape(path)
    assert "empty" in _one_line(info.value, path)


def test_newer_format_version(recorded: Session, tmp_path: Path) -> None:
    lines = recorded.path.read_text().splitlines(keepends=True)
    head = json.loads(lines[0])
    head["kvscope_tape"] = 99
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    with pytest.raises(TapeTooNew) as info:
        read_tape(path)
    words = _one_line(info.value, path)
    assert "99" in words
    assert "up to 1" in words
    assert "upgrade" in words


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("readme.md", b"# kvscope\n\nA terminal playground.\n", "not JSON"),
        ("data.json", b'{"model": "x", "steps": []}\n', "no 'kvscope_tape' header"),
        ("weights.bin", bytes(range(11, 256)) * 400, "no line break"),
        ("latin.txt", b"caf\xe9\n", "not text"),
        ("array.json", b"[1, 2, 3]\n", "header"),
        ("zero.jsonl", b'{"kvscope_tape": 0}\n', "version 0"),
    ],
    ids=["markdown", "other-json", "binary", "latin-1", "json-array", "version-0"],
)
def test_a_file_that_is_not_a_tape(tmp_path: Path, name: str, content: bytes, says: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(NotATape) as info:
        read_tape(path)
    words = _one_line(info.value, path)
    assert "not a kvscope tape" in words
    assert says in words


def test_a_folder_and_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotATape) as folder:
        read_tape(tmp_path)
    assert "folder" in _one_line(folder.value, tmp_path)
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TapeNotFound) as info:
        read_tape(missing)
    _one_line(info.value, missing)


def test_damage_before_the_last_line_is_an_error(recorded: Session, tmp_path: Path) -> None:
    lines = recorded.path.read_bytes().splitlines(keepends=True)
    lines[5] = lines[5][:10] + b"\n"
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(TapeCorrupt) as info:
        read_tape(path)
    assert info.value.line == 6
    assert "line 6" in _one_line(info.value, path)
