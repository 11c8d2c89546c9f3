"""Attached to a server that says odd things (#31, item 5): text that is not Unicode, a
reply that stalls under `generate --json`, chat turns that never finish.

Every server is a fake on loopback (tests/remote_server.py, tests/hostile_server.py), in
a thread of the test's own process; no vLLM is started, and the CLI runs with it poisoned.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from typing import TYPE_CHECKING

import pytest
from cli_helpers import KVSCOPE, finish_in_group, one_line, start_kvscope
from hostile_server import HostileServer
from remote_server import (
    FakeServer,
    chat_chunk,
    json_reply,
    sse,
    sse_event,
)

from engine.events import TokenEvent
from engine.tape.reader import read_tape
from engine.tape.recorder import TapeRecorder

if TYPE_CHECKING:
    from pathlib import Path

    from hostile_server import Mode
    from remote_server import FakeRequest, Reply, Route

ATTACHED = "kvscope: attached to"
QUICK = "1,1,0.3"  # --timeout: a stall ends after 0.3 s without a chunk
HANG_S = 60.0


@pytest.fixture(scope="module")
def no_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where importing vLLM fails loudly: attaching never needs it."""
    poison = tmp_path_factory.mktemp("no-vllm")
    (poison / "vllm").mkdir()
    (poison / "vllm" / "__init__.py").write_text('raise ImportError("kvscope imported vLLM")\n')
    env = {**os.environ, "PYTHONPATH": str(poison)}
    env["KVSCOPE_CONFIG_DIR"] = str(tmp_path_factory.mktemp("config"))
    for name in ("KVSCOPE_DEBUG", "VLLM_API_KEY", "OPENAI_API_KEY"):
        env.pop(name, None)
    return env


def kvscope_bytes(env: dict[str, str], *args: str) -> tuple[int, bytes, str]:
    """The exit code, stdout as bytes (to check it is UTF-8), stderr decoded."""
    proc = start_kvscope(*args, env=env)
    out, err = finish_in_group(proc, HANG_S, None)
    return proc.wait(), out, err.decode(errors="replace")


# -- a lone surrogate in the server's text ------------------------------------------------------
# `\udc9b` is what Python's surrogateescape makes of the byte 0x9b (C1 CSI, which some
# terminals obey as ESC [): written to stdout with that handler it became the raw byte.
PIECES = ("a\udc9bb", " c\ud800", " ok", "\udfff")
SHOWN = ("a\ufffdb", " c\ufffd", " ok", "\ufffd")
LONE = sum(1 for piece in PIECES for ch in piece if 0xD800 <= ord(ch) <= 0xDFFF)


def _surrogate_reply(_req: FakeRequest) -> Reply:
    parts = [chat_chunk(t, token_ids=[100 + i]) for i, t in enumerate(PIECES)]
    parts.append(chat_chunk("", token_ids=[], finish="stop"))
    usage = {"prompt_tokens": 7, "completion_tokens": len(PIECES), "total_tokens": 11}
    parts += [sse_event({"choices": [], "usage": usage}), b"data: [DONE]\n\n"]
    return sse(*parts)


def test_the_fixture_sends_the_escape_as_the_hostile_tester_did() -> None:
    """json.dumps escapes a lone surrogate (ASCII out): the very bytes of the report."""
    chunk = chat_chunk("a\udc9b", token_ids=[1])
    assert b'"a\\udc9b"' in chunk and json.loads(chunk[6:])["choices"][0]["delta"]["content"]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_lone_surrogate_is_kept_as_u_fffd_and_the_tape_is_whole(
    no_vllm: dict[str, str], tmp_path: Path, as_json: bool
) -> None:
    tape = tmp_path / "generate.jsonl"
    routes: dict[str, Route] = {"/v1/chat/completions": _surrogate_reply}
    flags = ["--json"] if as_json else []
    with FakeServer(routes) as server:
        code, out, err = kvscope_bytes(
            no_vllm, "generate", "--url", server.url, *flags, "--tape", str(tape)
        )
    assert code == 0, err
    # One line says it, once, with the count; no traceback (one_line checks).
    said = one_line(err, "U+FFFD", besides=(ATTACHED, "TTFT "))
    assert f"{LONE} lone surrogates" in said, said
    text = out.decode("utf-8")  # strict: raises on the raw 0x9b the reply once put there
    assert b"\x9b" not in out
    if as_json:
        assert json.loads(text)["text"] == "".join(SHOWN)
    else:
        assert text.startswith("".join(SHOWN))
    recorded = read_tape(tape)
    [request] = recorded.requests
    assert len(request.tokens) == len(PIECES), "a token record was lost"
    assert request.text == "".join(SHOWN)
    assert request.finished is not None and request.finished.output_tokens == len(PIECES)


@pytest.mark.parametrize("mid_stream", [False, True], ids=["http-500", "error-event"])
def test_a_lone_surrogate_in_a_refusal_is_u_fffd_in_its_line_and_on_the_tape(
    no_vllm: dict[str, str], tmp_path: Path, mid_stream: bool
) -> None:
    tape = tmp_path / "refused.jsonl"
    error = {"object": "error", "message": "bad \udc9b news", "code": 500}
    if mid_stream:
        refusal = sse(chat_chunk("Hi", token_ids=[5]), sse_event({"error": error}))
    else:
        refusal = json_reply(error, 500)
    with FakeServer({"/v1/chat/completions": lambda _r: refusal}) as server:
        code, _out, err = kvscope_bytes(
            no_vllm, "generate", "--url", server.url, "--json", "--tape", str(tape)
        )
    assert code == 1, err
    one_line(err, "bad \ufffd news", besides=(ATTACHED,))
    [request] = read_tape(tape).requests
    assert request.failure is not None and "bad \ufffd news" in request.failure.error.plain()


def test_the_tape_writes_a_record_whose_text_is_not_unicode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever handed it the text (a pasted prompt, an engine): the record is written
    with U+FFFD, every record after it too, and it is said once, not once a record."""
    path = tmp_path / "t.jsonl"
    recorder = TapeRecorder(path)
    with caplog.at_level(logging.WARNING, logger="kvscope"):
        recorder.record_user_message("hi \udc9b")
        for i in range(5):
            event = TokenEvent("r", i, (i,), f"x\udc9b{i}", i + 1, float(i), 0.01)
            recorder.record_event(event)
        recorder.close()
    assert recorder.notice is None
    tape = read_tape(path)
    assert [m.text for m in tape.messages] == ["hi \ufffd"]
    [request] = tape.requests
    assert [t.text for t in request.tokens] == [f"x\ufffd{i}" for i in range(5)]
    words = [r.getMessage() for r in caplog.records]
    assert not any("could not be encoded" in w for w in words), words
    replaced = [w for w in words if "U+FFFD" in w]
    assert len(replaced) == 1 and str(path) in replaced[0], words
    assert all(r.exc_info is None for r in caplog.records)


# -- generate --json after a stall ----------------------------------------------------------------
def test_generate_json_after_a_stall_prints_what_came_and_says_the_stall(
    no_vllm: dict[str, str],
) -> None:
    stalls = sse(chat_chunk("Hello", token_ids=[5]), chat_chunk(" you", token_ids=[6, 7]), None)
    with FakeServer({"/v1/chat/completions": lambda _r: stalls}) as server:
        code, out, err = kvscope_bytes(
            no_vllm, "generate", "--url", server.url, "--json", "--timeout", QUICK
        )
    assert code == 1, err  # documented in --help: 1 when the reply did not finish
    one_line(err, "sent nothing for 0.3 s after 3 tokens", besides=(ATTACHED,))
    result = json.loads(out)
    assert result["text"] == "Hello you"
    assert result["output_tokens"] == 3
    assert result["finish_reason"] is None
    assert result["failure"] == "timeout"
    assert "sent nothing for 0.3 s after 3 tokens" in result["error"]
    assert result["ttft_s"] is not None and result["ttft_s"] > 0
    # The second chunk held two tokens: they share its arrival time.
    assert len(result["itl_s"]) == 2 and result["itl_s"][1] == 0.0
    assert result["e2e_s"] is None
    # It stalled 0.3 s after the last chunk: the failure is at least that late.
    assert result["failed_after_s"] >= result["ttft_s"] + sum(result["itl_s"]) + 0.3


def test_generate_json_after_a_cut_prints_what_came(no_vllm: dict[str, str]) -> None:
    with HostileServer("cut", 2) as server:
        code, out, err = kvscope_bytes(
            no_vllm, "generate", "--url", server.url, "--json", "--max-tokens", "8"
        )
    assert code == 1, err
    one_line(err, "lost after 2 tokens", besides=(ATTACHED,))
    result = json.loads(out)
    assert result["text"] == " t0 t1" and result["output_tokens"] == 2
    assert result["failure"] == "cut" and result["finish_reason"] is None


def test_generate_help_says_the_exit_status(no_vllm: dict[str, str]) -> None:
    done = subprocess.run(
        [KVSCOPE, "generate", "-h"],
        capture_output=True,
        text=True,
        env=no_vllm,
        timeout=HANG_S,
        check=False,
    )
    assert "exit status" in done.stdout and "--json" in done.stdout


# -- chat turns that never finish -------------------------------------------------------------
def _multi_turn(env: dict[str, str], url: str, out: Path) -> tuple[int, str, dict[str, object]]:
    code, stdout, err = kvscope_bytes(
        env,
        "bench",
        "--url",
        url,
        "--turns",
        "3",
        "--sessions",
        "2",
        "--message-len",
        "8",
        "--output-len",
        "4",
        "--timeout",
        QUICK,
        "--json",
        str(out),
    )
    assert "Traceback" not in err, err
    return code, stdout.decode() + err, json.loads(out.read_text())


@pytest.mark.parametrize(
    ("mode", "n"),
    [
        # warm-up + turn 1 of both sessions stream; every later reply is HTTP 500
        pytest.param("fail_after", 3, id="http-500"),
        # every reply stalls after 2 of its 4 tokens
        pytest.param("stall", 2, id="stall"),
    ],
)
def test_unfinished_turns_have_no_ttft_and_the_run_is_not_complete(
    no_vllm: dict[str, str], tmp_path: Path, mode: Mode, n: int
) -> None:
    with HostileServer(mode, n) as server:
        code, shown, result = _multi_turn(no_vllm, server.url, tmp_path / "chat.json")
    assert code == 3, shown
    assert result["complete"] is False
    turns = result["turns"]
    assert isinstance(turns, list)
    for summary in turns:
        if summary["requests"] == 0:  # no turn of this index finished
            for key in ("mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms"):
                assert summary[key] is None, (summary["turns"], key, summary[key])
    requests = result["requests"]
    assert isinstance(requests, list)
    unfinished = [r for r in requests if r["error"]]
    assert unfinished and all(r["ttft_s"] is None for r in unfinished)
    # Sessions end at their first unfinished turn: the turns never sent are counted.
    assert result["not_sent"] == 2 * 3 - len(requests)
    # The table shows no 0 ms TTFT for a turn that has none.
    rows = [line for line in shown.splitlines() if line.startswith("│")]
    never = [row.split("│") for row in rows if row.split("│")[2].strip() in ("0", "0+2✗")]
    assert never and all(c.strip() == "-" for cells in never for c in cells[3:7]), rows
    planned = 2 * 3
    assert f"{planned - len(requests)} of {planned} planned turns were never sent" in shown


async def test_the_playground_shows_a_lone_surrogate_as_u_fffd() -> None:
    """The chat's reply, the screen, and a screenshot (SVG: UTF-8) all hold U+FFFD."""
    from tui_helpers import engine_ready, make_app, reply_done, send_chat

    from engine.remote import RemoteEngine
    from tui.widgets.reply_block import ReplyBlock

    with FakeServer({"/v1/chat/completions": _surrogate_reply}) as server:
        engine = RemoteEngine(server.url, kv_events=None, scrape_interval_s=1.0)
        app = make_app(engine=engine)
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await engine_ready(pilot)
                await send_chat(pilot, "hello")
                await reply_done(pilot)
                reply = app.main_screen.query(ReplyBlock).last()
                screen = app.export_screenshot()
        finally:
            engine.shutdown()
    assert reply.text.startswith("".join(SHOWN))
    screen.encode("utf-8")  # strict: a lone surrogate on screen has no UTF-8
    assert "a\ufffdb" in screen.replace("&#160;", " ")
