"""Session tapes wired into the CLI and the app: `kvscope replay` (--json, --svg, bad
tapes), the playground's --tape/--no-tape/--resume, and `generate --tape`.

No vLLM anywhere: the subprocess cases block `vllm` and `torch` outright, so a replay
that reached for either would fail; the app cases drive a FakeEngine on virtual time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_helpers import one_line
from test_tape import record_fake_session
from tui_helpers import (
    engine_ready,
    make_app,
    notified,
    reply_done,
    send_chat,
    settle,
    wait_until,
)

from cli.main import main
from cli.replay import tape_json, token_times
from cli.session_tape import (
    RESUME_LATEST,
    SessionRecording,
    SessionTape,
    add_tape_args,
    resume_tape,
    session_tape,
)
from engine.clock import VirtualClock
from engine.events import (
    ChatMessage,
    GenerationRequest,
    PrefixCacheView,
    RemoteCapabilities,
    SamplingSettings,
    ScrapeListener,
    TokenEvent,
)
from engine.fake import FakeEngine
from engine.features import EngineFeatures
from engine.tape import (
    RecordingEngine,
    TapeHasNoSession,
    TapeRecorder,
    TapeUnwritable,
    read_tape,
)
from tui.app import KvscopeApp
from tui.session_tape import EARLIER_NOTE, announce_tape, restore_transcript

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.pilot import Pilot

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "docs" / "tapes" / "kv-pool-preemption.jsonl"

NO_ENGINE = """
import sys
sys.modules["vllm"] = None  # any import of them now fails
sys.modules["torch"] = None
from cli.main import main
code = main(sys.argv[1:])
heavy = [m for m in ("vllm", "torch", "transformers") if sys.modules.get(m) is not None]
print("HEAVY:" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


HEAVY = ("HEAVY:",)
"""How NO_ENGINE's own report on stderr starts: not a line of kvscope's."""


def kvscope_without_engine(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_ENGINE, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "KVSCOPE_CONFIG_DIR": os.environ.get("KVSCOPE_CONFIG_DIR", "")},
    )


# -- kvscope replay --json --------------------------------------------------------------------


def test_replay_json_is_what_the_tape_holds_with_no_vllm_or_torch() -> None:
    out = kvscope_without_engine("replay", str(POOL), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY:\n" in out.stderr + "\n"
    printed = json.loads(out.stdout)
    tape = read_tape(POOL)
    # Every step, field for field (JSON round-trips floats exactly).
    assert printed["steps"] == json.loads(json.dumps([dataclasses.asdict(s) for s in tape.steps]))
    assert printed["model"]["name"] == "SmolLM2-135M-Instruct"
    assert printed["ended"] == "closed" and printed["warnings"] == []
    # Every request: the keys and values of `generate --json`, and every token's time.
    assert [r["request_id"] for r in printed["requests"]] == [r.request_id for r in tape.requests]
    for shown, recorded in zip(printed["requests"], tape.requests, strict=True):
        finished = recorded.finished
        assert finished is not None
        assert shown["ttft_s"] == finished.ttft_s and shown["itl_s"] == list(finished.itl_s)
        assert shown["e2e_s"] == finished.e2e_s
        assert shown["output_tokens"] == finished.output_tokens
        assert shown["prompt_tokens"] == finished.prompt_tokens
        assert shown["finish_reason"] == finished.reason
        assert shown["token_times"] == token_times(recorded)
        assert len(shown["token_times"]) == finished.output_tokens
        assert shown["text"] == recorded.text and shown["status"] == "finished"
    fill = printed["requests"][1]
    assert fill["message"] == "Tell me a long story." and fill["synthetic_tokens"] == 512
    # That it is quick is the HEAVY line above (neither vLLM nor torch imported), not a time:
    # a bound in seconds was one machine's (14 s against 10 under a busy loop per core).


def test_json_counts_each_token_once_after_a_preemption(tmp_path: Path) -> None:
    # The fake recomputes a preempted copy and sends its tokens again: each position
    # keeps its last time, as the engines count it, so the times match the finish.
    session = tmp_path / "session.jsonl"
    record_fake_session(session)
    tape = read_tape(session)
    printed = {r["request_id"]: r for r in tape_json(tape)["requests"]}
    resent = [r for r in tape.requests if len(r.tokens) > len({e.index for e in r.tokens})]
    assert resent  # the session did preempt and resend
    for recorded in resent:
        finished = recorded.finished
        assert finished is not None
        times = printed[recorded.request_id]["token_times"]
        assert len(times) == finished.output_tokens
        assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx(finished.itl_s)


def test_json_of_a_cut_tape_sums_up_what_came(tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    record_fake_session(session)
    data = session.read_bytes()
    at = 0
    for _ in range(10):
        at = data.index(b'\n["t","r2"', at + 1)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: at + 1])
    printed = tape_json(read_tape(cut))
    assert printed["ended"] is None  # the recording never closed
    open_reply = next(r for r in printed["requests"] if r["request_id"] == "r2")
    assert open_reply["status"] == "interrupted" and open_reply["finish_reason"] is None
    assert open_reply["output_tokens"] == len(open_reply["token_times"]) == 9
    assert len(open_reply["itl_s"]) == 8 and open_reply["ttft_s"] > 0


# -- bad tapes: one line, exit 1 --------------------------------------------------------------


def _bad_tapes(folder: Path) -> dict[str, tuple[Path, str]]:
    tape = POOL.read_bytes()
    header, _, rest = tape.partition(b"\n")
    newer = header.replace(b'"kvscope_tape":1', b'"kvscope_tape":99')
    lines = rest.split(b"\n")
    damaged = b"\n".join([header, lines[0], b'["s", "not a step"]', *lines[1:]])
    files = {
        "empty": (b"", "is empty (0 bytes)"),
        "not-a-tape": (b"hello, world\n", "is not a kvscope tape"),
        "newer": (newer + b"\n" + rest, "format version 99"),
        "damaged": (damaged, "is damaged at line 3"),
    }
    out: dict[str, tuple[Path, str]] = {}
    for name, (content, says) in files.items():
        path = folder / f"{name}.jsonl"
        path.write_bytes(content)
        out[name] = (path, says)
    out["missing"] = (folder / "missing.jsonl", "No tape at")
    out["folder"] = (folder, "it is a folder")
    return out


@pytest.mark.parametrize("mode", [[], ["--json"], ["--svg", "x.svg"]], ids=["app", "json", "svg"])
def test_every_bad_tape_is_one_line_and_exit_1(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], mode: list[str]
) -> None:
    for name, (path, says) in _bad_tapes(tmp_path).items():
        args = [
            "replay",
            str(path),
            *[str(tmp_path / m) if m.endswith(".svg") else m for m in mode],
        ]
        assert main(args) == 1, name
        out, err = capfd.readouterr()
        assert says in one_line(err), name
        assert out == ""


def test_a_bad_tape_in_a_process_with_no_vllm(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a tape at all\n")
    out = kvscope_without_engine("replay", str(path))
    assert out.returncode == 1
    assert one_line(out.stderr, besides=HEAVY) == (
        f"kvscope: {path} is not a kvscope tape: its first line is not a tape header (not JSON)."
    )


def test_a_torn_last_line_is_a_warning_and_the_rest_replays(tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    data = POOL.read_bytes()
    torn.write_bytes(data[: len(data) - 40])  # the end line, cut mid-write
    # In its own process: there the reader's log line would reach stderr too, if let.
    out = kvscope_without_engine("replay", str(torn), "--json")
    assert out.returncode == 0
    assert "ends with a line cut mid-write" in one_line(out.stderr, besides=HEAVY)
    printed = json.loads(out.stdout)
    assert len(printed["steps"]) == len(read_tape(POOL).steps)
    assert printed["warnings"] and printed["ended"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--speed", "0"], "Bad value for --speed: 0.0 is not a speed"),
        (["--at", "3"], "Bad value for --at: it picks the step for --svg"),
        (
            ["--svg", "OUT", "--at", "9999"],
            "9,999 is not a step record of this tape: it has 0 to 705",
        ),
        (["--svg", "/no/such/folder/x.svg"], "the folder /no/such/folder does not exist"),
        (["--svg", "OUT", "--size", "big"], "'big' is not WIDTHxHEIGHT"),
        (["--json", "--svg", "OUT"], "not allowed with argument"),
    ],
)
def test_replay_options_are_checked_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    args = [str(tmp_path / "x.svg") if a == "OUT" else a for a in args]
    try:
        code = main(["replay", str(POOL), *args])
    except SystemExit as exc:  # argparse's own refusals leave through sys.exit
        code = int(exc.code or 0)
    assert code in (1, 2)
    _, err = capfd.readouterr()
    assert says in one_line(err)


# -- kvscope replay --svg ----------------------------------------------------------------------


def test_svg_at_a_step_is_saved_headless_with_no_vllm(tmp_path: Path) -> None:
    out_svg = tmp_path / "at300.svg"
    out = kvscope_without_engine(
        "replay", str(POOL), "--svg", str(out_svg), "--at", "300", "--size", "120x36"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        out.stdout.strip()
        == f"saved {out_svg}: the replay at record 300 / 705 (engine step 820), 120x36"
    )
    svg = out_svg.read_text()
    for words in (
        "record&#160;300&#160;/&#160;705&#160;·&#160;engine&#160;step&#160;820",
        "paused",
        "r2.2",
        "+4&#160;more&#160;requests",
        "streaming&#160;·&#160;235",
    ):
        assert words in svg, words


# -- recording this session ------------------------------------------------------------------


def app_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fake", action="store_true")
    add_tape_args(parser)
    return parser.parse_args(list(argv))


def test_the_playground_records_by_default_and_flags_choose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "tapes"
    monkeypatch.setenv("KVSCOPE_TAPE_DIR", str(folder))
    default = session_tape(app_args(), None, record_by_default=True)
    assert default.recorder is not None and default.recorder.path.parent == folder
    default.close()
    assert session_tape(app_args("--no-tape"), None, record_by_default=True).recorder is None
    assert session_tape(app_args(), None, record_by_default=False).recorder is None  # --fake
    chosen = session_tape(
        app_args("--tape", str(tmp_path / "mine.jsonl")), None, record_by_default=False
    )
    assert chosen.recorder is not None and chosen.recorder.path == tmp_path / "mine.jsonl"
    chosen.close()
    # A default folder that cannot be written: the session goes on, and says why.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVSCOPE_TAPE_DIR", str(blocker / "tapes"))
    fallback = session_tape(app_args(), None, record_by_default=True)
    assert fallback.recorder is None
    assert fallback.problem is not None and fallback.problem.startswith("Not recording")
    # A tape the user named must open.
    with pytest.raises(TapeUnwritable):
        session_tape(app_args("--tape", str(blocker / "x.jsonl")), None, record_by_default=True)


def test_an_unwritable_tape_stops_the_command_before_any_engine(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for command in (["generate"], ["bench", "--runs", "1"], ["--fake"]):
        out = kvscope_without_engine(*command, "--tape", str(blocker / "x.jsonl"), timeout=60)
        assert out.returncode == 1, (command, out.stderr[-2000:])
        line = one_line(out.stderr, besides=HEAVY)
        assert line.startswith(f"kvscope: Cannot record a tape at {blocker / 'x.jsonl'}: ")


def test_a_recording_hands_on_what_the_engine_offers_beyond_the_protocol(tmp_path: Path) -> None:
    class Remote(FakeEngine):
        @property
        def features(self) -> EngineFeatures:
            return EngineFeatures(exact_steps=False, clock=self.clock, remote=self)

        @property
        def capabilities(self) -> RemoteCapabilities:
            raise NotImplementedError

        def add_scrape_listener(self, listener: ScrapeListener) -> Callable[[], None]:
            return lambda: None

        def prefix_cache(self) -> PrefixCacheView:
            raise NotImplementedError

        def new_session(self, session_id: str | None = None) -> str:
            return "new"

    inner = Remote(clock=VirtualClock())
    wrapped = SessionRecording(inner, TapeRecorder(tmp_path / "r.jsonl"))
    features = wrapped.features
    assert features.remote is inner
    assert features.remote.new_session() == "new"
    assert features.exact_steps is False
    assert features.tape is wrapped  # the recording is the session's tape
    assert features.clock is inner.clock
    plain = RecordingEngine(FakeEngine(), wrapped.recorder).features
    assert plain.remote is None and plain.tape is not None and plain.exact_steps
    wrapped.close_tape()


async def test_the_app_says_where_it_records_and_tapes_each_send(tmp_path: Path) -> None:
    fake = FakeEngine(clock=VirtualClock())
    path = tmp_path / "session.jsonl"
    recorder = TapeRecorder(path, clock=fake.features.clock)
    app = make_app(engine=SessionRecording(fake, recorder))
    app.script = SessionTape(recorder, None).script(None)
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        # Read while it is up: the toast lasts 12 s, which two chats on a loaded host
        # outlast (a fresh clone under load failed once reading it after them).
        said = await notified(pilot, "Recording this session to")
        assert said == f"Recording this session to {path} (--no-tape turns it off)."
        await send_chat(pilot, "What does the KV cache hold?")
        await reply_done(pilot)
        await pilot.press("ctrl+n")
        await send_chat(pilot, "Hello again")
        await reply_done(pilot)
        await app.action_quit()  # shuts the engine down, which closes the tape
        await pilot.pause(0.2)
    tape = read_tape(path)
    assert tape.end is not None and tape.card is not None
    assert [(m.text, m.request_ids) for m in tape.messages] == [
        ("What does the KV cache hold?", ("r1",)),
        ("Hello again", ("r2",)),
    ]
    assert len(tape.new_chats) == 1
    assert [t.message.text for t in tape.last_chat() if t.message] == ["Hello again"]
    assert all(r.status == "finished" for r in tape.requests) and tape.steps


async def test_a_size_cap_notice_comes_as_a_toast(tmp_path: Path) -> None:
    fake = FakeEngine(clock=VirtualClock())
    recorder = TapeRecorder(tmp_path / "small.jsonl", clock=fake.features.clock, cap_bytes=6_000)
    app = make_app(engine=SessionRecording(fake, recorder))
    async with app.run_test(size=(160, 48)) as pilot:
        announce_tape(app, recorder, None)
        await engine_ready(pilot)
        await send_chat(pilot, "Fill the tape.")
        await reply_done(pilot)
        toast = await notified(pilot, "Recording stopped: the tape", severity="warning")
        assert toast.startswith("Recording stopped: the tape")
        assert "size cap" in toast
    recorder.close()


# -- --resume ---------------------------------------------------------------------------------

USER1 = ChatMessage("user", "What is a KV cache?")
USER2 = ChatMessage("user", "And why does it grow?")


def killed_mid_reply(path: Path, *, earlier: tuple[ChatMessage, ...] = ()) -> Path:
    """A FakeEngine chat of two turns, recorded, then cut in the second reply as a
    `kill -9` leaves it (the recorder flushes per step; the rest never reached the file)."""
    fake = FakeEngine(clock=VirtualClock())
    engine = RecordingEngine(fake, TapeRecorder(path, clock=fake.features.clock))
    engine.start()

    async def chat() -> None:
        engine.record_user_message(USER1.content, request_ids=["r1"])
        first = GenerationRequest(
            "r1", messages=(*earlier, USER1), sampling=SamplingSettings(max_tokens=8)
        )
        reply = "".join([e.text async for e in engine.stream(first) if isinstance(e, TokenEvent)])
        engine.record_user_message(USER2.content, request_ids=["r2"])
        history = (*earlier, USER1, ChatMessage("assistant", reply), USER2)
        second = GenerationRequest("r2", messages=history, sampling=SamplingSettings(max_tokens=40))
        async for _ in engine.stream(second):
            pass

    asyncio.run(chat())
    engine.shutdown()
    data = path.read_bytes()
    at = 0
    for _ in range(10):  # just before the second reply's 10th token
        at = data.index(b'\n["t","r2"', at + 1)
    path.write_bytes(data[: at + 1])
    return path


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return killed_mid_reply(tmp_path_factory.mktemp("resume") / "killed.jsonl")


async def test_resume_restores_transcript_footers_and_history(killed: Path, tmp_path: Path) -> None:
    tape = read_tape(killed)
    history = tape.chat_history()
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    fake = FakeEngine(clock=VirtualClock())
    new_tape = tmp_path / "next.jsonl"
    app = make_app(engine=RecordingEngine(fake, TapeRecorder(new_tape, clock=fake.clock)))
    # As the CLI runs it: the session tape's start-up script, with the tape to resume.
    app.script = SessionTape(None, tape).script(None)
    async with app.run_test(size=(160, 48)) as pilot:
        main = app.main_screen
        await engine_ready(pilot)
        await wait_for_replies(pilot, 2)
        first, cut = main.chat.replies()
        assert first.title == "assistant · r1" and first.done
        assert first.footer_text.startswith("TTFT ") and "tok/s" in first.footer_text
        assert cut.title == "assistant · r2"
        assert cut.text == history[3].content and cut.primary.received == 9
        assert cut.footer_text == (
            "✗ Interrupted: the recording stops here, mid-reply, after 9 tokens (the session "
            "was cut off, by a crash or a kill)."
        )
        transcript = main.chat.transcript_text()
        assert USER1.content in transcript and USER2.content in transcript
        assert "Resumed from killed.jsonl: 2 turn(s) restored" in transcript
        assert main.conversation.messages == list(history)

        # The next message goes on from there, on the fresh engine, numbered after them.
        await send_chat(pilot, "Go on.")
        await reply_done(pilot)
        assert main.chat.replies()[-1].title == "assistant · r3"
        assert main.conversation.messages[:4] == list(history)
        await app.action_quit()
        await pilot.pause(0.2)
    sent = read_tape(new_tape).requests[0]
    assert sent.request_id == "r3"
    assert sent.request.messages == (*history, ChatMessage("user", "Go on."))


async def wait_for_replies(pilot: Pilot[int], n: int) -> None:
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    await wait_until(pilot, lambda: len(app.main_screen.chat.replies()) >= n, what="replies")
    await settle(pilot)


@pytest.fixture
def torn(killed: Path, tmp_path: Path) -> Path:
    path = tmp_path / "torn.jsonl"
    path.write_bytes(killed.read_bytes() + b'["t","r2",9,[12')  # a write cut by the kill
    return path


async def test_a_torn_tape_resumes_and_says_so(torn: Path) -> None:
    tape = read_tape(torn)
    assert tape.warnings
    app = make_app()
    app.script = SessionTape(None, tape).script(None)
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        await wait_for_replies(pilot, 2)
        await notified(pilot, "ends with a line cut mid-write")
        assert app.main_screen.chat.replies()[1].primary.received == 9


EARLIER = (ChatMessage("user", "Hi, who are you?"), ChatMessage("assistant", "A model."))


@pytest.fixture(scope="module")
def killed_after_a_resume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session that resumed one turn of chat, then sent two of its own and was killed."""
    return killed_mid_reply(tmp_path_factory.mktemp("again") / "again.jsonl", earlier=EARLIER)


async def test_a_resumed_session_resumed_again_keeps_its_older_turns(
    killed_after_a_resume: Path,
) -> None:
    tape = read_tape(killed_after_a_resume)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        await restore_transcript(app.main_screen, tape)
        await settle(pilot)
        transcript = app.main_screen.chat.transcript_text()
        assert f"{EARLIER_NOTE}\nHi, who are you?\nA model." in transcript
        assert app.main_screen.conversation.messages[:2] == list(EARLIER)


def test_resume_finds_the_newest_tape_that_holds_a_chat(
    killed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "tapes"
    folder.mkdir()
    monkeypatch.setenv("KVSCOPE_TAPE_DIR", str(folder))
    assert main(["--fake", "--resume"]) == 1
    assert one_line(capfd.readouterr().err) == (
        f"kvscope: No tape to resume: {folder} holds none (every session is recorded there "
        "unless --no-tape is given). Name one: --resume TAPE."
    )
    chat = folder / "20260101-100000.jsonl"
    chat.write_bytes(killed.read_bytes())
    quiet = folder / "20260101-110000.jsonl"  # a later session that sent nothing
    TapeRecorder(quiet).close()
    broken = folder / "20260101-120000.jsonl"  # one that crashed before its header
    broken.write_bytes(b"")
    for age, path in enumerate((broken, quiet, chat)):
        os.utime(path, (time.time() - age * 60, time.time() - age * 60))
    assert resume_tape(RESUME_LATEST).path == chat
    with pytest.raises(TapeHasNoSession):  # named, but nothing in it to go on from
        resume_tape(str(quiet))
    assert main(["--fake", "--resume", str(tmp_path / "nope.jsonl")]) == 1
    assert "No tape at" in one_line(capfd.readouterr().err)
