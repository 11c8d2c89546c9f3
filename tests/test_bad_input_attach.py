"""The bad-input matrix of attach mode: servers that stall, lie or send garbage, and URLs
that are not one. Every server here is a fake on loopback (tests/remote_server.py), made
inside the test; no vLLM is started or even imported (the CLI runs with vLLM poisoned).

Each CLI case checks the exit code, one `kvscope: ...` line with the numbers, no traceback
and no process left in its group; in-process cases check that no kvscope thread is left.
Timeouts are a few hundred ms, so the whole file runs in seconds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_helpers import one_line, run_kvscope
from held_clock import HeldClock
from polling import wait_for
from remote_server import (
    FakeServer,
    chat_chunk,
    chat_reply,
    free_port,
    hang,
    head,
    json_reply,
    models_route,
    raw,
    sse,
    text_reply,
)

from engine.errors import KvscopeError
from engine.events import GenerationRequest, RequestFinished, SamplingSettings, TokenEvent
from engine.remote import RemoteEngine
from engine.remote.client import SseDecoder, parse_server_url
from engine.remote.timeouts import ServerStalled, Timeouts

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "remote"
ATTACHED = "kvscope: attached to"
QUICK = "0.3"  # --timeout for the cases that wait on a silent server
DEFAULTS = Timeouts()
FALLBACK_S = min(DEFAULTS.first_byte_s, DEFAULTS.between_chunks_s)
"""The soonest a default limit could end a wait on a silent server. A run given --timeout
0.3 that ends before this ended on the limit it was given, however slowly the machine
started Python: no bound here is read off one machine's start-up time."""
HANG_S = 4 * FALLBACK_S
"""How long a command may run before it counts as hung: past every default limit, so a
wrong limit shows as a failed bound with the command's own words, not as a kill."""
PASSWORD = "hunter2-planted"
BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


# -- running kvscope ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def no_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where importing vLLM fails loudly: attaching must never start an
    engine here (an empty --url once quietly loaded vLLM)."""
    poison = tmp_path_factory.mktemp("no-vllm")
    (poison / "vllm").mkdir()
    (poison / "vllm" / "__init__.py").write_text('raise ImportError("kvscope imported vLLM")\n')
    env = {**os.environ, "PYTHONPATH": str(poison)}
    env.pop("KVSCOPE_DEBUG", None)
    for name in ("VLLM_API_KEY", "OPENAI_API_KEY"):
        env.pop(name, None)
    return env


def kvscope(
    env: dict[str, str], *args: str, timeout: float = HANG_S
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the command in its own process group (cli_helpers.run_kvscope); returns it
    and its wall time."""
    began = time.perf_counter()
    done = run_kvscope(*args, env=env, timeout=timeout)
    return done, time.perf_counter() - began


def refused(out: subprocess.CompletedProcess[str], code: int, *says: str) -> str:
    """The exit code, and the one line (besides the attach notice) that says each of `says`."""
    assert out.returncode == code, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    return one_line(out.stderr, *says, besides=(ATTACHED,))


def _kvscope_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kvscope-")]


@pytest.fixture
def no_threads_left() -> Iterator[None]:
    before = set(_kvscope_threads())
    yield
    deadline = time.monotonic() + 5
    while set(_kvscope_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(_kvscope_threads()) - before, _kvscope_threads()


# -- URLs that are not a server's (item 11, 12) --------------------------------------------------
@pytest.mark.parametrize(
    ("url", "says"),
    [
        pytest.param("", ("--url", "it is empty"), id="empty"),
        pytest.param(" ", ("--url", "it is empty"), id="blank"),
        pytest.param("http://[::1:8000", ("--url", "[::1:8000", "IPv6"), id="broken-ipv6"),
        pytest.param("javascript:alert(1)", ("--url", "not an http:// or https://"), id="js"),
        pytest.param("http://127.0.0.1:99999", ("--url", "port 99999", "1 to 65535"), id="port"),
        pytest.param("ftp://gpu-box", ("--url", "ftp://"), id="ftp"),
        pytest.param("http://:8000", ("--url", "names no host"), id="no-host"),
    ],
)
def test_a_url_that_is_no_server_is_one_line_before_any_engine(
    no_vllm: dict[str, str], url: str, says: Sequence[str]
) -> None:
    for command in (["generate", "--max-tokens", "2"], ["bench", "--prompt-lens", "8"], []):
        out, _ = kvscope(no_vllm, *command, "--url", url)
        refused(out, 2, *says)
        assert "imported vLLM" not in out.stderr


def test_timeouts_are_in_help_and_bad_ones_refused(no_vllm: dict[str, str]) -> None:
    out, _ = kvscope(no_vllm, "generate", "--help")
    assert out.returncode == 0
    assert "default 5,60,30" in " ".join(out.stdout.split())
    for bad, says in (("0", "above 0"), ("abc", "'abc' is not a number"), ("1,2", "three")):
        out, _ = kvscope(no_vllm, "generate", "--url", "127.0.0.1:1", "--timeout", bad)
        refused(out, 2, "--timeout", says)
    assert Timeouts.parse("2") == Timeouts(2, 2, 2)
    assert Timeouts.parse("1,90,15.5") == Timeouts(1, 90, 15.5)


# -- timeouts (item 1) ---------------------------------------------------------------------------
def test_a_server_silent_after_the_request_times_out_on_the_first_byte(
    no_vllm: dict[str, str],
) -> None:
    with FakeServer({"/v1/chat/completions": lambda _r: hang()}) as server:
        out, took = kvscope(no_vllm, "generate", "--url", server.url, "--timeout", QUICK)
    refused(out, 1, server.url, "sent nothing for 0.3 s", "first-byte timeout", "--timeout")
    assert took < FALLBACK_S, f"{took:.1f} s: not the 0.3 s first-byte limit that ended it"


def test_a_server_that_stops_mid_reply_times_out_between_chunks_and_keeps_the_text(
    no_vllm: dict[str, str],
) -> None:
    stalls = sse(chat_chunk("Hello", token_ids=[5]), chat_chunk(" you", token_ids=[6]), None)
    with FakeServer({"/v1/chat/completions": lambda _r: stalls}) as server:
        out, took = kvscope(no_vllm, "generate", "--url", server.url, "--timeout", f"1,1,{QUICK}")
    refused(out, 1, "sent nothing for 0.3 s after 2 tokens", "between-chunks timeout")
    assert out.stdout.startswith("Hello you")
    assert took < FALLBACK_S, f"{took:.1f} s: not the 0.3 s between-chunks limit that ended it"


def test_a_server_that_hangs_at_attach_is_one_line(no_vllm: dict[str, str]) -> None:
    with FakeServer({"/v1/models": lambda _r: hang()}) as server:
        out, took = kvscope(no_vllm, "generate", "--url", server.url, "--timeout", QUICK)
    refused(out, 1, server.url, "0.3 s", "first-byte timeout")
    assert ATTACHED not in out.stderr
    assert took < FALLBACK_S, f"{took:.1f} s: not the 0.3 s limit that ended the attach"


def _full_backlog() -> tuple[list[Any], int]:
    """A port whose listen queue is full: a SYN there is dropped, so connect() hangs."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    held: list[Any] = [listener]
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    time.sleep(0.1)
    return held, port


def test_a_connect_that_never_completes_times_out(no_threads_left: None) -> None:
    held, port = _full_backlog()
    try:
        limits = Timeouts(0.3, 5, 5)
        engine = RemoteEngine(f"http://127.0.0.1:{port}", kv_events=None, timeouts=limits)
        began = time.perf_counter()
        with pytest.raises(ServerStalled) as info:
            engine.start()
        took = time.perf_counter() - began
        # Ended by the connect limit, before the next one (5 s) could have been the one.
        assert took < limits.first_byte_s, f"{took:.1f} s for a {limits.connect_s} s limit"
        assert info.value.wait == "connect"
        assert "within 0.3 s (the connect timeout" in info.value.plain()
        engine.shutdown()
    finally:
        for s in held:
            s.close()


async def until_sent(server: FakeServer, path: str, timeout_s: float = HANG_S) -> None:
    """Wait, with the loop running, until the fake server has read a request for `path`."""
    deadline = time.monotonic() + timeout_s
    while path not in server.paths():
        assert time.monotonic() < deadline, f"no request for {path} in {server.paths()}"
        await asyncio.sleep(0.01)


def _one_reply(engine: RemoteEngine, request: GenerationRequest) -> list[object]:
    async def run() -> list[object]:
        got: list[object] = []
        try:
            async for event in engine.stream(request):
                got.append(event)
        except KvscopeError as exc:
            got.append(exc)
        return got

    return asyncio.run(run())


def _chat(text: str = "hi", max_tokens: int = 4) -> GenerationRequest:
    from engine.events import ChatMessage

    return GenerationRequest(
        "r1", messages=(ChatMessage("user", text),), sampling=SamplingSettings(max_tokens)
    )


def test_abort_frees_a_reply_the_server_never_answers(no_threads_left: None) -> None:
    """Esc's path (engine.abort) ends a reply stuck before its first byte at once, long
    before any timeout, and the next request works."""
    replies = iter([hang(), chat_reply("ok")])
    with FakeServer({"/v1/chat/completions": lambda _r: next(replies)}) as server:
        engine = RemoteEngine(server.url, kv_events=None)
        engine.start()
        try:

            async def run() -> tuple[list[object], float]:
                got: list[object] = []

                async def consume() -> None:
                    async for event in engine.stream(_chat()):
                        got.append(event)

                task = asyncio.create_task(consume())
                await until_sent(server, "/v1/chat/completions")
                began = time.perf_counter()
                engine.abort("r1")
                # The only limit that could end this reply is the first-byte one (60 s):
                # ending well inside it, with reason "abort", is the abort's doing.
                await asyncio.wait_for(task, DEFAULTS.first_byte_s / 2)
                return got, time.perf_counter() - began

            got, took = asyncio.run(run())
            assert isinstance(got[-1], RequestFinished), got
            assert got[-1].reason == "abort", f"{got[-1]} after {took:.1f} s"
            again = _one_reply(engine, _chat())
            assert isinstance(again[-1], RequestFinished)
        finally:
            engine.shutdown()


async def test_esc_in_the_playground_frees_a_reply_the_server_never_answers(
    no_threads_left: None,
) -> None:
    from tui_helpers import engine_ready, make_app, reply_done, send_chat, wait_until

    with FakeServer({"/v1/chat/completions": lambda _r: hang()}) as server:
        engine = RemoteEngine(server.url, kv_events=None, scrape_interval_s=1.0)
        app = make_app(engine=engine)
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await engine_ready(pilot)
                await send_chat(pilot, "hello?")
                await wait_until(
                    pilot,
                    lambda: "/v1/chat/completions" in server.paths(),
                    what="the chat request to reach the server",
                )
                assert app.main_screen.busy
                await pilot.press("escape")
                # Well inside the first-byte limit (60 s), the only one that could end it.
                await reply_done(pilot, timeout=DEFAULTS.first_byte_s / 2)
        finally:
            engine.shutdown()


async def test_the_server_panel_says_when_scrapes_stop() -> None:
    from textual.app import App, ComposeResult

    from engine.events import RemoteCapabilities
    from engine.remote.metrics import ScrapeState, cache_info, parse_metrics
    from tui.widgets.remote_state import RemoteStateView

    clock = HeldClock(1000.0)

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            view = RemoteStateView()
            view.clock = clock
            yield view

    parsed = parse_metrics((FIXTURES / "metrics_busy.txt").read_text())
    sample = ScrapeState().update(parsed, 1.0, cache_info(parsed))
    caps = RemoteCapabilities("http://gpu-box:8000", True, True, "", False, "", None)
    async with Host().run_test() as pilot:
        view = pilot.app.query_one(RemoteStateView)
        view.capabilities = caps
        view.sample = sample
        clock.now += 9.5
        view.check_stale()
        await pilot.pause()
        assert "does not answer" not in str(view.render())
        clock.now += 2.0
        view.check_stale()
        await pilot.pause()
        shown = " ".join(line.text for line in view.render_lines(view.region))
        assert "attached to http://gpu-box:8000: the server does not answer" in shown
        assert "(no scrape for 11 s)" in shown
        view.sample = ScrapeState().update(parsed, 2.0, cache_info(parsed))  # a scrape again
        await pilot.pause()
        shown = " ".join(line.text for line in view.render_lines(view.region))
        assert "does not answer" not in shown


# -- credentials in the URL (item 2) -------------------------------------------------------------
def _secret_url(server: FakeServer) -> str:
    return server.url.replace("http://", f"http://alice:{PASSWORD}@")


def _planted(text: str) -> bool:
    return PASSWORD in text or BASIC in text or "YWxpY2U6" in text


def _grep_tree(folder: Path) -> list[str]:
    hits = []
    for path in folder.rglob("*"):
        if path.is_file() and _planted(path.read_bytes().decode("latin-1")):
            hits.append(str(path))
    return hits


def test_credentials_in_the_url_are_sent_as_a_header_and_written_nowhere(
    no_vllm: dict[str, str], tmp_path: Path
) -> None:
    env = {**no_vllm, "KVSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    env["KVSCOPE_CONFIG_DIR"] = str(tmp_path / "config")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with FakeServer() as server:
        url = _secret_url(server)
        tape = ["--tape", str(out_dir / "generate.jsonl")]
        bench = ["--prompt-lens", "16", "--runs", "1", "--output-len", "2"]
        runs = [
            kvscope(env, "generate", "--url", url, "--max-tokens", "3", "--json", *tape),
            kvscope(env, "generate", "--url", url, "--max-tokens", "3"),
            kvscope(env, "bench", "--url", url, *bench, "--json", str(out_dir / "bench.json")),
            kvscope(env, "--url", url, "--screenshot", str(out_dir / "screen.svg"), timeout=90),
        ]
        sent = [r.headers.get("authorization") for r in server.requests]
    for out, _ in runs:
        assert out.returncode == 0, out.stderr[-2000:]
        assert not _planted(out.stdout + out.stderr), out.stderr
    assert f"{ATTACHED} {server.url}:" in runs[0][0].stderr
    assert json.loads(runs[0][0].stdout)["model"]["device"].endswith(server.url)
    assert {p.name for p in out_dir.iterdir()} >= {"generate.jsonl", "bench.json", "screen.svg"}
    assert not _grep_tree(tmp_path), _grep_tree(tmp_path)
    assert sent and set(sent) == {f"Basic {BASIC}"}  # every request carried them


def test_url_credentials_and_an_api_key_together_are_refused(no_vllm: dict[str, str]) -> None:
    out, _ = kvscope(
        no_vllm, "generate", "--url", f"http://a:{PASSWORD}@127.0.0.1:1", "--api-key", "k"
    )
    line = refused(out, 1, "--api-key", "give one of them")
    assert PASSWORD not in line


def test_the_parsed_url_keeps_no_secret() -> None:
    where = parse_server_url(f"https://alice:{PASSWORD}@gpu-box:8443/v1/")
    assert where.root == "https://gpu-box:8443"
    assert where.authorization == f"Basic {BASIC}"
    assert PASSWORD not in repr(where) and PASSWORD not in str(where)
    assert parse_server_url("[::1]:8000").root == "http://[::1]:8000"
    odd = parse_server_url("http://al%40ce:p%3Ass@h")
    assert odd.authorization == "Basic " + base64.b64encode(b"al@ce:p:ss").decode()


async def test_no_screen_of_an_attached_session_shows_the_password(no_threads_left: None) -> None:
    """At 160x48 the chat, the Model card and the Server box are all on one screen."""
    from tui_helpers import engine_ready, make_app, reply_done, send_chat

    with FakeServer() as server:
        engine = RemoteEngine(_secret_url(server), kv_events=None, scrape_interval_s=1.0)
        app = make_app(engine=engine)
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await engine_ready(pilot)
                await send_chat(pilot, "hello")
                await reply_done(pilot)
                screen = app.export_screenshot().replace("&#160;", " ")
        finally:
            engine.shutdown()
    assert f"attached to {server.url}" in screen  # the Server box
    assert f"remote {server.url}" in screen or "max_model_len" in screen  # the Model card
    assert not _planted(screen)


# -- a server's answers that are not what vLLM says (item 12) ------------------------------------
@pytest.mark.parametrize(
    ("routes", "args", "says"),
    [
        pytest.param(
            {"/tokenize": lambda _r: json_reply({"tokens": "abc"})},
            ["--prompt-tokens", "10"],
            ("tokenize answered tokens 'abc'", "list of token IDs"),
            id="tokens-a-string",
        ),
        pytest.param(
            {"/tokenize": lambda _r: json_reply({"tokens": None})},
            ["--prompt-tokens", "10"],
            ("tokenize answered tokens null",),
            id="tokens-null",
        ),
        pytest.param(
            {"/tokenize": lambda _r: json_reply({"tokens": [1, "x", 3]})},
            ["--prompt-tokens", "10"],
            ("'x' among its token IDs",),
            id="tokens-with-a-string",
        ),
        pytest.param(
            {"/v1/models": lambda _r: json_reply({"data": [{"max_model_len": 5}]})},
            [],
            ("/v1/models lists a model with no id", "max_model_len"),
            id="model-without-id",
        ),
        pytest.param(
            {"/v1/models": models_route(max_model_len=True)},
            [],
            ("max_model_len true", "not a context length"),
            id="max-model-len-true",
        ),
        pytest.param(
            {"/v1/models": models_route(max_model_len=-5)},
            [],
            ("max_model_len -5", "not a context length"),
            id="max-model-len-negative",
        ),
        pytest.param(
            {"/v1/models": models_route(max_model_len=10**11)},
            ["--prompt-tokens", "300000000"],
            ("300,000,000 tokens", "10,000,000"),
            id="max-model-len-1e11",
        ),
        pytest.param(
            {
                "/v1/chat/completions": lambda _r: raw(
                    head(302, Location="http://127.0.0.1:9/elsewhere", Content_Length="0")
                )
            },
            [],
            ("HTTP 302, a redirect to http://127.0.0.1:9/elsewhere",),
            id="redirect-302",
        ),
        pytest.param(
            {"/v1/chat/completions": lambda _r: json_reply({}, 500)},
            [],
            ("HTTP 500",),
            id="empty-500",
        ),
        pytest.param(
            {"/v1/chat/completions": lambda _r: sse(chat_chunk("a"), b"data: 5\n\n")},
            [],
            ("lost after 1 tokens", "garbled stream: a chunk of type int, not an object"),
            id="chunk-a-number",
        ),
        pytest.param(
            {"/v1/chat/completions": lambda _r: sse(b"data: " + b"[" * 100_000 + b"\n\n")},
            [],
            ("lost after 0 tokens", "garbled stream", "recursion"),
            id="chunk-nested-deep",
        ),
    ],
)
def test_answers_that_are_not_vllms_are_one_line(
    no_vllm: dict[str, str], routes: dict[str, Any], args: list[str], says: Sequence[str]
) -> None:
    with FakeServer(routes) as server:
        out, took = kvscope(no_vllm, "generate", "--url", server.url, "--max-tokens", "2", *args)
    line = refused(out, 1, *says)
    assert "unexpected error" not in line
    assert ": ." not in line
    # A huge claimed context builds nothing: a map of 1e11 tokens would not be done by the
    # time a default limit could have fired, on any machine.
    assert took < FALLBACK_S, f"{took:.1f} s"


def test_a_redirect_whose_target_refuses_names_both(no_vllm: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    moved = raw(head(302, Location=f"{dead}/v1/models", Content_Length="0"))
    with FakeServer({"/v1/models": lambda _r: moved}) as server:
        out, _ = kvscope(no_vllm, "generate", "--url", server.url)
    refused(out, 1, "connection refused", f"at {dead}/v1/models", f"where {server.url} redirected")


# -- escape codes in model text (item 6) ---------------------------------------------------------
HOSTILE = ("Hi", "\x1b[2J", "\x1b]0;owned\x07", "\x1b]52;c;aGk=\x07", "\x9b31m", " end\r\n")


def test_escape_codes_from_the_server_are_shown_not_obeyed(no_vllm: dict[str, str]) -> None:
    with FakeServer({"/v1/chat/completions": lambda _r: chat_reply(*HOSTILE)}) as server:
        out, _ = kvscope(no_vllm, "generate", "--url", server.url, "--max-tokens", "8")
        as_json, _ = kvscope(
            no_vllm, "generate", "--url", server.url, "--max-tokens", "8", "--json"
        )
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\x9b" not in out.stdout
    assert "\r" not in out.stdout
    assert out.stdout.startswith("Hi␛[2J␛]0;owned␇␛]52;c;aGk=␇\ufffd31m end␍\n")
    assert "\x1b" not in as_json.stdout  # JSON escapes it; the text itself is kept
    assert json.loads(as_json.stdout)["text"] == "".join(HOSTILE)


async def test_escape_codes_in_a_reply_are_shown_in_the_chat(no_threads_left: None) -> None:
    from tui_helpers import engine_ready, make_app, reply_done, send_chat

    from tui.widgets.reply_block import ReplyBlock

    with FakeServer({"/v1/chat/completions": lambda _r: chat_reply(*HOSTILE)}) as server:
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
    assert reply.text.startswith("Hi␛[2J␛]0;owned␇")
    assert "\x1b" not in reply.text and "\x07" not in reply.text
    assert "␛[2J" in screen.replace("&#160;", " ")


# -- bounds on what a server sends (item 7) ------------------------------------------------------
def _decode_one_event(kib: int) -> float:
    """Seconds to decode one event of `kib` KiB fed in 16 KiB reads: the best of three."""
    event = b"data: " + b"x" * (kib * 1024) + b"\n\n"
    best = float("inf")
    for _ in range(3):
        got: list[str] = []
        feeding = SseDecoder()
        began = time.perf_counter()
        for i in range(0, len(event), 16 * 1024):
            got += feeding.feed(event[i : i + 16 * 1024])
        best = min(best, time.perf_counter() - began)
        assert len(got) == 1 and len(got[0]) == kib * 1024
    return best


def test_sse_parsing_is_linear_and_bounded() -> None:
    # 64 times the bytes: 64 times the time if each byte is looked at a bounded number of
    # times, about 64 x 64 if every read searches the event from its start. The bound sits
    # at 10 x 64, between the two: room for the big event missing the caches (0.5 MiB fits
    # them, 32 MiB does not: 20 MB once took 33x the time of 2 MB under load, which the
    # old 30x bound at ten times the bytes could not tell from a quadratic scan) and still
    # 4x under the quadratic case (AMD EPYC, AVX2: linear 81x, a scan from the start 2,671x).
    # A ratio on the same machine, not a number of seconds read off one.
    small, big = _decode_one_event(512), _decode_one_event(32 * 1024)
    assert big < 10 * 64 * small, f"0.5 MiB in {small * 1e3:.1f} ms, 32 MiB in {big * 1e3:.0f} ms"
    # CRLF split across reads, several events in one read, comments and other fields.
    d = SseDecoder()
    assert list(d.feed(b"data: a\r")) == []
    assert list(d.feed(b"\n\r\ndata: b\n: note\nevent: x\ndata: c\n\ndata: d")) == ["a", "b\nc"]
    assert list(d.feed(b"\n\n")) == ["d"]
    capped = SseDecoder(max_event_bytes=1000)
    for _ in range(9):
        assert list(capped.feed(b"data: " + b"y" * 100)) == []
    with pytest.raises(ValueError, match="over 1,000 bytes"):
        list(capped.feed(b"data: " + b"y" * 100))


def test_a_huge_event_is_a_lost_connection_not_a_hang(
    monkeypatch: pytest.MonkeyPatch, no_threads_left: None
) -> None:
    from engine.remote import client

    monkeypatch.setattr(client, "MAX_EVENT_BYTES", 1024)
    monkeypatch.setattr(client.SseDecoder.__init__, "__defaults__", (1024,))
    big = sse(chat_chunk("a", token_ids=[1]), b"data: " + b"z" * 5000 + b"\n\n", None)
    with FakeServer({"/v1/chat/completions": lambda _r: big}) as server:
        engine = RemoteEngine(server.url, kv_events=None, timeouts=Timeouts(1, 2, 2))
        engine.start()
        try:
            got = _one_reply(engine, _chat())
        finally:
            engine.shutdown()
    assert any(isinstance(e, TokenEvent) for e in got)
    error = got[-1]
    assert isinstance(error, KvscopeError)
    assert "after 1 tokens" in error.plain()
    assert "an event of over 1,024 bytes" in error.plain()


# -- bad samples from /metrics (item 5) ----------------------------------------------------------
BUSY = (FIXTURES / "metrics_busy.txt").read_text()
BAD_SAMPLES = (
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
    'vllm:num_requests_running{engine="0",model_name="m"} +Inf\n'
    'vllm:num_requests_waiting{engine="²",model_name="m"} 1\n'
    'vllm:time_to_first_token_seconds_bucket{engine="0",le="soon",model_name="m"} 1\n'
)


def test_bad_samples_are_dropped_and_counted() -> None:
    from engine.remote.metrics import ScrapeState, cache_info, parse_metrics

    parsed = parse_metrics(BUSY + BAD_SAMPLES)
    assert parsed.bad == 4
    assert parsed.first_bad == "vllm:kv_cache_usage_perc is nan"
    sample = ScrapeState().update(parsed, 1.0, cache_info(parsed))
    assert sample.kv_usage == pytest.approx(0.3222, abs=1e-3)  # the good one, from BUSY
    garbled = parse_metrics(BUSY + "vllm:num_requests_running{engine=0} not-a-number\n")
    assert garbled.bad == 1 and "cannot read" in garbled.first_bad
    assert garbled.get("vllm:kv_cache_usage_perc")  # the rest of the text still counts
    inf_pool = BUSY.replace('num_gpu_blocks="91"', 'num_gpu_blocks="inf"')
    assert inf_pool != BUSY
    info = cache_info(parse_metrics(inf_pool))
    assert info is not None and info.num_gpu_blocks == 0


def test_bad_samples_never_stop_the_scrapes(no_vllm: dict[str, str]) -> None:
    """NaN, inf, a bad `le` and a non-ASCII engine label, from attach on: the session
    goes on, the scrapes too, and the count is said in one line."""
    # A reply slow enough for scrapes to land in it, even from a scraper thread a loaded
    # host runs late: 2 s between its two tokens (scrapes come every 0.2 s).
    slow = sse(chat_chunk("a", token_ids=[1]), 2.0, chat_chunk("b", token_ids=[2], finish="stop"))
    routes = {
        "/metrics": lambda _r: text_reply(BUSY + BAD_SAMPLES),
        "/v1/chat/completions": lambda _r: slow,
    }
    with FakeServer(routes) as server:
        out, _ = kvscope(no_vllm, "generate", "--url", server.url, "--max-tokens", "3", "--json")
    assert out.returncode == 0, out.stderr
    line = one_line(out.stderr, "bad samples from /metrics", besides=(ATTACHED,))
    assert "Exception in thread" not in out.stderr
    count = int(line.split("kvscope: ")[1].split(" ")[0])
    assert count >= 4 and count % 4 == 0  # 4 at attach, 4 more each scrape
    assert json.loads(out.stdout)["steps"], "the scrapes went on"


def test_the_scraper_thread_outlives_any_scrape(no_threads_left: None) -> None:
    scrapes = iter([BUSY + BAD_SAMPLES, "vllm:x{ 1\n\x00\xff", BUSY] * 50)
    with FakeServer({"/metrics": lambda _r: text_reply(next(scrapes))}) as server:
        engine = RemoteEngine(server.url, kv_events=None, scrape_interval_s=0.02)
        seen: list[object] = []
        engine.add_scrape_listener(seen.append)
        engine.start()
        try:
            deadline = time.monotonic() + 5  # 250 scrape intervals
            while len(seen) < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(seen) >= 6, f"{len(seen)} scrapes in 5 s: {engine.capabilities}"
            # Whichever scrape came last (a garbled one has no good sample at all), the
            # count of what was dropped is said.
            assert "bad samples from /metrics dropped" in engine.capabilities.metrics_note
            assert "kvscope-scrape" in _kvscope_threads()
        finally:
            engine.shutdown()


# -- KV events that are not vLLM's (items 5, 7) --------------------------------------------------
def _batch(*events: Any, ts: Any = 1.0) -> bytes:
    import msgspec

    return msgspec.msgpack.encode([ts, list(events), 0])


def _stored(hashes: list[Any], block_size: Any = 16, tokens: int = 16) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(tokens)),
        "block_size": block_size,
        "session_id": "chat-a",
    }


def test_bad_kv_events_are_dropped_and_the_rest_kept() -> None:
    from engine.remote.kv_event_wire import decode_batch

    batch = decode_batch(
        _batch(
            _stored([1], block_size=float("inf")),
            _stored([2], block_size="abc"),
            _stored([3], block_size=-16),
            _stored(["not-a-hash"]),
            _stored(list(range(100_000)), tokens=0),  # far more blocks than any event holds
            {"no": "type"},
            _stored([4]),
            ts=float("nan"),
        )
    )
    assert batch.bad == 6
    assert [e.block_hashes for e in batch.events] == [(4,)]
    assert batch.ts == 0.0


def subscribed(xpub: Any, what: str, timeout_s: float = HANG_S) -> None:
    """Wait for the next subscription an XPUB socket reads: a SUB has (re)connected."""
    import zmq

    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and xpub.poll(left_ms, zmq.POLLIN), f"timed out waiting for {what}"
        if xpub.recv()[:1] == b"\x01":
            return


def test_the_kv_event_thread_survives_garbage_floods_and_huge_frames(
    no_threads_left: None,
) -> None:
    import zmq

    from engine.remote.kv_event_sources import EventSource
    from engine.remote.kv_event_subscriber import MAX_FRAME_BYTES, KvEventSubscriber
    from engine.remote.prefix_cache_index import PrefixCacheIndex

    port = free_port()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    # An XPUB is a PUB to the subscriber, and says when one has subscribed: the test waits
    # for that, not for a guess at ZMQ's slow joiner.
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, a re-dial's too
    pub.bind(f"tcp://127.0.0.1:{port}")
    index = PrefixCacheIndex(max_blocks=1000)
    sub = KvEventSubscriber([EventSource(0, f"tcp://127.0.0.1:{port}", False, None)], index)

    def send(*frames: bytes) -> None:
        # Copied, never zero-copy: zero-copy starts pyzmq's garbage thread, and ctx.term()
        # beside it aborted a CI worker (term and unfinished zero-copy sends: pyzmq #65).
        pub.send_multipart(list(frames), copy=True)

    try:
        assert sub.start() == ""
        subscribed(pub, "the subscriber to connect")
        send(b"kv", (0).to_bytes(8, "big"), _batch(_stored([1], block_size=float("inf"))))
        send(b"kv", b"\x00", b"\xc1garbage")
        send(b"kv", (1).to_bytes(8, "big"), b"\xc1 not msgpack")
        # Read before the huge frame goes: when ZMQ closes the connection, the thread dials
        # again, and a message still queued on the old connection goes with it (a loaded CI
        # machine lost both this way).
        assert wait_for(lambda: sub.bad >= 2, HANG_S), f"{sub.bad} of 2 bad messages read"
        send(b"kv", (2).to_bytes(8, "big"), b"x" * (MAX_FRAME_BYTES + 1))  # dropped by ZMQ
        subscribed(pub, "the subscriber to dial again after dropping the huge frame")
        assert sub.dropped >= 1
        for n in range(3, 3000):  # a flood of distinct blocks: the index stays bounded
            send(b"kv", n.to_bytes(8, "big"), _batch(_stored([10_000 + n])))
        deadline = time.monotonic() + 10
        while index.stored_total < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.stored_total >= 500, f"{index.stored_total} of 2,997 blocks arrived"
        assert len(index) <= 1000
        assert sub.bad_events >= 1
        assert "kvscope-kv-events" in _kvscope_threads()
    finally:
        sub.stop()
        pub.close(linger=0)
        ctx.term()


def test_an_answer_past_the_cap_is_not_read_on(
    monkeypatch: pytest.MonkeyPatch, no_threads_left: None
) -> None:
    from engine.remote import client

    monkeypatch.setattr(client, "MAX_ANSWER_BYTES", 1024)
    gap_s, reads = 0.05, 1000
    pieces: list[bytes | float | None] = [b"x" * 4096, gap_s] * reads
    endless = sse(*pieces)  # 4 MB over 50 s: it is cut at 1 KB, in the first read
    with FakeServer({"/v1/models": lambda _r: endless}) as server:
        engine = RemoteEngine(server.url, kv_events=None)
        began = time.perf_counter()
        with pytest.raises(KvscopeError, match="answered more than 1,024 bytes"):
            engine.start()
        took = time.perf_counter() - began
        # Read on to its end, the answer would take gap_s * reads: cut, it takes a sliver.
        assert took < gap_s * reads / 2, f"{took:.2f} s of a {gap_s * reads:.0f} s answer"
        engine.shutdown()
