"""RemoteEngine against a real vLLM CPU server on 127.0.0.1 (see tests/remote_server.py).

One server for the whole session (`vllm_server` in conftest.py; 25-40 s to start on 2
cores), started with --api-key: every test sends the right key except the ones about keys.
The last test kills that server mid-stream and starts it again on the same ports, so
nothing else needs a second server. Only one engine may listen for KV events at a time (it
binds the address the server's PUB socket connects to): the shared `remote` engine does;
the others pass kv_events=None.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from polling import wait_for
from remote_server import API_KEY, BLOCK_SIZE, MAX_MODEL_LEN, VllmServer

from engine.errors import AuthRequired, ConnectionLost, PromptTooLong, ServerUnreachable
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    RequestAccepted,
    RequestFinished,
    SamplingSettings,
    ScrapeSample,
    StepSample,
    TokenEvent,
)
from engine.remote import RemoteEngine

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

pytestmark = pytest.mark.engine

LONG_CHAT = "Tell me how ships find their way across the ocean at night. " * 16


@pytest.fixture(scope="module")
def remote(vllm_server: VllmServer) -> Iterator[RemoteEngine]:
    engine = RemoteEngine(vllm_server.url, api_key=API_KEY)
    engine.start()
    yield engine
    engine.shutdown()


async def collect(events: AsyncIterator[EngineEvent]) -> list[EngineEvent]:
    return [e async for e in events]


def finished(events: list[EngineEvent]) -> RequestFinished:
    last = events[-1]
    assert isinstance(last, RequestFinished), events[-3:]
    return last


async def settles(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """`wait_for` for async tests: the event loop runs meanwhile (a stream walked away
    from is closed, and its request aborted, by a task on that loop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


def chat(rid: str, text: str, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(
        rid, messages=(ChatMessage("user", text),), sampling=SamplingSettings(max_tokens)
    )


async def test_chat_streams_with_server_timings(remote: RemoteEngine) -> None:
    card = remote.card
    assert card is not None
    assert (card.max_model_len, card.block_size) == (MAX_MODEL_LEN, BLOCK_SIZE)
    assert card.total_blocks > 0
    assert "num_layers" in card.unknown
    assert card.num_layers == 0

    before = time.perf_counter()
    events = await collect(remote.stream(chat("c1", "Say hello in five words.")))
    accepted, tokens, fin = events[0], events[1:-1], finished(events)
    assert isinstance(accepted, RequestAccepted)
    assert accepted.submitted_at >= before
    template = remote.chat_prompt_ids((ChatMessage("user", "Say hello in five words."),))
    assert accepted.prompt_tokens == len(template)
    assert tokens
    assert all(isinstance(t, TokenEvent) for t in tokens)
    assert "".join(t.text for t in tokens if isinstance(t, TokenEvent)).strip()
    n = sum(len(t.token_ids) for t in tokens if isinstance(t, TokenEvent))
    assert fin.output_tokens == n
    assert fin.reason in ("stop", "length")
    assert fin.prompt_tokens == accepted.prompt_tokens
    assert fin.ttft_s is not None
    assert 0 < fin.ttft_s <= fin.e2e_s
    assert len(fin.itl_s) == n - 1
    assert fin.server is not None
    assert fin.server.ttft_s is not None
    assert fin.server.ttft_s <= fin.ttft_s  # the server's clock starts later, at scheduling
    assert remote.session_of("c1") == remote.session_id
    assert remote.capabilities.server_timings is True


async def test_synthetic_prompt_is_exact_and_ttft_grows(remote: RemoteEngine) -> None:
    ttft: dict[int, float] = {}
    server_ttft: dict[int, float] = {}
    for n in (64, 400):
        best = best_server = float("inf")
        for seed in (101, 102):  # fresh seeds: no prefix-cache hits; best of two
            ids = remote.synthetic_prompt(n, "Now summarise.", seed=seed + n)
            assert len(ids) == n
            request = GenerationRequest(
                f"s{n}-{seed}", prompt_token_ids=ids, sampling=SamplingSettings(4, ignore_eos=True)
            )
            events = await collect(remote.stream(request))
            fin = finished(events)
            assert isinstance(events[0], RequestAccepted)
            assert events[0].prompt_tokens == n
            assert fin.prompt_tokens == n  # the server's usage block
            assert fin.output_tokens == 4
            assert fin.ttft_s is not None
            assert fin.server is not None
            assert fin.server.ttft_s is not None
            best = min(best, fin.ttft_s)
            best_server = min(best_server, fin.server.ttft_s)
        ttft[n], server_ttft[n] = best, best_server
    print(f"\nTTFT client {ttft} server {server_ttft}")
    # More prompt is more prefill: the server's own TTFT (scheduled to first token) grows,
    # and the client's, which holds the server's, grows with it. By how much is the
    # machine's (the share of fixed costs in a short prefill), so only the order is
    # asserted, and that the client never reports less than the server measured.
    assert server_ttft[400] > server_ttft[64], server_ttft
    assert ttft[400] > ttft[64], ttft
    assert all(ttft[n] >= server_ttft[n] for n in ttft), (ttft, server_ttft)


class _Records(logging.Handler):
    """kvscope's log lines, kept: a scraper that fails logs why, into a file nobody sees."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {self.format(record)}")


def scrape_timeline(
    scrapes: list[ScrapeSample], submitted: float, fin: RequestFinished, remote: RemoteEngine
) -> str:
    """Every scrape against the request's own clock: what a failure in CI must show."""
    ttft = fin.ttft_s or 0.0
    lines = [
        f"request: first token at {ttft:.2f} s, finished at {fin.e2e_s:.2f} s, "
        f"{fin.output_tokens} tokens ({fin.reason}); bad samples {remote.bad_samples}; "
        f"metrics note: {remote.capabilities.metrics_note!r}"
    ]
    lines += [scrape_line(s, submitted) for s in scrapes]
    return "\n".join(lines)


def scrape_line(s: ScrapeSample, since: float) -> str:
    return (
        f"{s.time_s - since:7.2f} s  seq {s.seq}  kv {s.kv_usage:.3f}  running {s.running}"
        f"  waiting {s.waiting}  prompt +{s.prompt_tokens}  generated +{s.generation_tokens}"
    )


def quiet(s: ScrapeSample) -> bool:
    """The server, as this scrape says: no request running, waiting or holding KV blocks,
    and no token counted since the scrape before."""
    held = (s.running, s.waiting, s.kv_usage, s.prompt_tokens, s.generation_tokens)
    return held == (0, 0, 0.0, 0, 0)


def first_quiet_after_the_first(scrapes: list[ScrapeSample]) -> int | None:
    """The index of the first quiet scrape heard after the first one heard, if any.

    The first scrape a new listener hears may have been sent before the listener was
    added: on a busy host the scraper's thread hands it on late, and the server may have
    answered it before an earlier test's last request ran. The scraper sends each scrape
    only after handing on the one before, so every later one was sent after."""
    return next((i for i in range(1, len(scrapes)) if quiet(scrapes[i])), None)


QUIET_WITHIN_S = 60.0
"""How long a test waits for the session's server to end what earlier tests left on it: a
hang guard (an aborted request ends within a step, a finished one is already counted)."""

PROMPT, REPLY = 400, 96  # the request whose blocks the scrapes must see


async def test_scraped_kv_usage_rises_then_falls(remote: RemoteEngine) -> None:
    scrapes: list[ScrapeSample] = []
    steps: list[StepSample] = []
    records = _Records()
    kvscope_log = logging.getLogger("kvscope")
    kvscope_log.addHandler(records)
    began = time.perf_counter()
    remove = remote.add_scrape_listener(scrapes.append)
    remove_steps = remote.add_step_listener(steps.append)
    try:
        # The server is the session's, and this test sums its counters' growth: it counts
        # from a scrape that was sent after this test began and shows the server quiet,
        # so every earlier test's request has ended and its tokens are counted before it.
        # (Counting from the first scrape heard once took in the previous test's request.)
        def settled() -> bool:
            return first_quiet_after_the_first(scrapes) is not None

        assert wait_for(settled, QUIET_WITHIN_S), (
            f"the server was not quiet within {QUIET_WITHIN_S:g} s of this test's start; "
            "its scrapes since:\n" + "\n".join(scrape_line(s, began) for s in scrapes)
        )
        baseline = first_quiet_after_the_first(scrapes)
        assert baseline is not None  # it stays found: the list only grows
        start = baseline + 1
        # A short prompt and a long reply: the blocks are held for the whole decode, and a
        # decode of 96 steps spans many scrapes on any CPU (one of 48 once saw none in CI).
        ids = remote.synthetic_prompt(PROMPT, seed=7)
        request = GenerationRequest(
            "kv-rise", prompt_token_ids=ids, sampling=SamplingSettings(REPLY, ignore_eos=True)
        )
        events = await collect(remote.stream(request))
        accepted, fin = events[0], finished(events)
        assert isinstance(accepted, RequestAccepted)
        fell = wait_for(lambda: scrapes[-1].kv_usage == 0.0 and scrapes[-1].running == 0, 5)
    finally:
        remove()
        remove_steps()
        kvscope_log.removeHandler(records)
    during = scrapes[start:]
    timeline = scrape_timeline(during, accepted.submitted_at, fin, remote)
    log_lines = "\n".join(records.lines) or "(kvscope logged nothing)"
    why = f"{timeline}\nkvscope's log:\n{log_lines}"
    assert fell, why
    assert fin.output_tokens == REPLY
    blocks_needed = -(-(PROMPT + REPLY - 1) // BLOCK_SIZE)
    peak = max(s.kv_usage for s in during)
    print(f"\nKV usage peak {peak:.3f} over {len(during)} scrapes; TTFT {fin.ttft_s:.3f} s")
    assert peak >= 0.9 * blocks_needed / during[0].total_blocks, why
    assert max(s.used_blocks for s in during) >= blocks_needed - 2, why
    assert max(s.running for s in during) == 1, why
    assert during[-1].kv_usage == 0.0
    # Counter growth between scrapes adds up to this request's tokens (nothing else ran).
    assert sum(s.prompt_tokens for s in during) == PROMPT, why
    assert sum(s.generation_tokens for s in during) == REPLY, why
    assert any(s.generation_tokens_per_s > 0 for s in during)
    assert during[-1].ttft.count >= 1
    assert during[-1].itl.count >= REPLY - 1
    row = during[-1].rows[0]
    assert row.engine == "0"
    assert row.total_blocks == during[-1].total_blocks
    # The same scrapes reach step listeners as StepSamples.
    assert min(s.free_blocks for s in steps) <= steps[0].total_blocks - (blocks_needed - 2)


async def test_kv_events_land_under_the_chat_session(remote: RemoteEngine) -> None:
    first = remote.new_session("chat-kv-one")
    fin = finished(await collect(remote.stream(chat("kv1", LONG_CHAT, 8))))
    full_blocks = fin.prompt_tokens // BLOCK_SIZE
    assert full_blocks >= 3

    def mine(session: str) -> list[object]:
        return [b for b in remote.prefix_cache().blocks if b.session_id == session]

    assert wait_for(lambda: len(mine(first)) >= full_blocks, 5), remote.prefix_cache().note
    view = remote.prefix_cache()
    blocks = [b for b in view.blocks if b.session_id == first]
    assert all(b.num_tokens == BLOCK_SIZE for b in blocks)
    assert all(isinstance(b.block_hash, int) for b in blocks)  # hashes, never block IDs
    assert view.receiving
    assert remote.capabilities.kv_events

    # The same chat in a new session: a prefix-cache hit, reported under the new session.
    second = remote.new_session("chat-kv-two")
    again = finished(await collect(remote.stream(chat("kv2", LONG_CHAT, 8))))
    assert again.server is not None
    assert (again.server.cached_prompt_tokens or 0) >= BLOCK_SIZE

    def shared() -> int:
        return sum(1 for b in remote.prefix_cache().blocks if b.touched_by[:2] == (first, second))

    assert wait_for(lambda: shared() >= full_blocks - 1, 5)


async def test_prompt_too_long_then_next_request_works(remote: RemoteEngine) -> None:
    # Token IDs: checked before sending, with the server's rule (prompt < max_model_len).
    for n in (MAX_MODEL_LEN, MAX_MODEL_LEN + 76):
        ids = tuple([1000] * n)
        with pytest.raises(PromptTooLong) as info:
            await collect(remote.stream(GenerationRequest(f"long{n}", prompt_token_ids=ids)))
        assert (info.value.prompt_tokens, info.value.max_model_len) == (n, MAX_MODEL_LEN)

    # A chat: the server refuses with a 400 and counts only to max_model_len + 1; the exact
    # count comes from /tokenize.
    text = "hello " * 1200
    exact = len(remote.chat_prompt_ids((ChatMessage("user", text),)))
    with pytest.raises(PromptTooLong) as info:
        await collect(remote.stream(chat("long-chat", text)))
    assert (info.value.prompt_tokens, info.value.max_model_len) == (exact, MAX_MODEL_LEN)
    assert f"{exact:,} tokens" in info.value.plain()
    assert "1,024" in info.value.plain()

    fin = finished(await collect(remote.stream(chat("after-long", "Hi!", 4))))
    assert fin.output_tokens > 0


async def test_server_refusal_of_token_prompt_is_read(vllm_server: VllmServer) -> None:
    """Past the client's own check: the server's 400 text gives the numbers."""
    engine = RemoteEngine(vllm_server.url, api_key=API_KEY, kv_events=None)
    card = engine.start()
    try:
        # Pretend the card said more, so the request reaches the server.
        engine._card = dataclasses.replace(card, max_model_len=4 * MAX_MODEL_LEN)
        for n in (MAX_MODEL_LEN + 76, MAX_MODEL_LEN):
            with pytest.raises(PromptTooLong) as info:
                await collect(
                    engine.stream(GenerationRequest(f"srv{n}", prompt_token_ids=(1000,) * n))
                )
            assert (info.value.prompt_tokens, info.value.max_model_len) == (n, MAX_MODEL_LEN)
    finally:
        engine.shutdown()


async def test_abort_and_walking_away_free_the_server(remote: RemoteEngine) -> None:
    ids = remote.synthetic_prompt(100, seed=21)
    request = GenerationRequest(
        "abort-me", prompt_token_ids=ids, sampling=SamplingSettings(500, ignore_eos=True)
    )
    events: list[EngineEvent] = []
    async for event in remote.stream(request):
        events.append(event)
        if sum(isinstance(e, TokenEvent) for e in events) == 3:
            remote.abort("abort-me")
    fin = finished(events)
    assert fin.reason == "abort"
    assert 3 <= fin.output_tokens < 500

    def idle() -> bool:
        last = remote.last_scrape
        return last is not None and last.running == 0 and last.kv_usage == 0.0

    assert await settles(idle, 5)

    # A consumer that stops listening aborts its request too.
    request = GenerationRequest(
        "walk-away", prompt_token_ids=ids, sampling=SamplingSettings(500, ignore_eos=True)
    )
    got = 0
    async for event in remote.stream(request):
        got += isinstance(event, TokenEvent)
        if got == 2:
            break
    # A blocking wait here starved the loop that closes the abandoned stream: the request
    # then ran to its 500 tokens, and passed or failed by how fast the host was.
    assert await settles(idle, 5)


def test_wrong_or_missing_api_key(vllm_server: VllmServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AuthRequired) as info:
        RemoteEngine(vllm_server.url, api_key="not-the-key", kv_events=None).start()
    assert info.value.key_sent
    assert info.value.status == 401
    assert "wants an API key" in info.value.plain()
    assert vllm_server.url in info.value.plain()

    with pytest.raises(AuthRequired) as info:
        RemoteEngine(vllm_server.url, kv_events=None).start()
    assert not info.value.key_sent
    assert "wants an API key" in info.value.plain()

    monkeypatch.setenv("VLLM_API_KEY", API_KEY)  # the key from the environment works
    engine = RemoteEngine(vllm_server.url + "/v1", kv_events=None)
    try:
        assert engine.start().max_model_len == MAX_MODEL_LEN
    finally:
        engine.shutdown()


async def test_metrics_missing_chat_still_works(vllm_server: VllmServer) -> None:
    engine = RemoteEngine(
        vllm_server.url, api_key=API_KEY, kv_events=None, metrics_path="/no-metrics-here"
    )
    card = engine.start()
    try:
        caps = engine.capabilities
        assert caps.reachable
        assert not caps.metrics
        assert "/no-metrics-here" in caps.metrics_note
        assert "chat still works" in caps.metrics_note
        assert "total_blocks" in card.unknown
        assert card.max_model_len == MAX_MODEL_LEN
        assert "KV events are off" in caps.kv_events_note
        fin = finished(await collect(engine.stream(chat("no-metrics", "Hello there!", 4))))
        assert fin.output_tokens > 0
        assert engine.last_scrape is None
    finally:
        engine.shutdown()


# Keep this test last: it kills the session's server and starts it again.
def test_generate_and_bench_attach_with_url(vllm_server: VllmServer, tmp_path: Path) -> None:
    """The headless commands on a server: the same fields as in-process, and the same
    shape: TTFT grows with the prompt. No engine flag may ride along with --url."""
    kvscope = str(Path(sys.executable).with_name("kvscope"))
    env = {**os.environ, "VLLM_API_KEY": API_KEY}
    gen = subprocess.run(
        [
            kvscope,
            "generate",
            "--url",
            vllm_server.url,
            "--kv-events",
            "off",
            "--prompt-tokens",
            "300",
            "--max-tokens",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert gen.returncode == 0, gen.stderr
    record = json.loads(gen.stdout)
    assert record["prompt_tokens"] == 300
    assert record["output_tokens"] == 4
    assert record["steps_are"] == "scrapes"
    assert record["server"]["ttft_s"] is not None
    out = tmp_path / "r.json"
    bench = subprocess.run(
        [
            kvscope,
            "bench",
            "--url",
            vllm_server.url,
            "--kv-events",
            "off",
            "--prompt-lens",
            "64,400",
            "--runs",
            "2",
            "--output-len",
            "8",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert bench.returncode == 0, bench.stderr
    points = json.loads(out.read_text())["points"]
    assert [p["prompt_len"] for p in points] == [64, 400]
    assert all(p["ok"] for p in points)
    assert points[1]["mean_ttft_ms"] > points[0]["mean_ttft_ms"]
    assert all(r["server"] is not None for p in points for r in p["requests"])
    # The server runs with --enable-mfu-metrics: each point is on the roofline, from its
    # counters' deltas over the scrape windows it ran in (no share: no --hardware).
    for p in points:
        roof = p["roofline"]
        assert roof.get("missing") is None, roof
        assert roof["source"] == "vllm counters" and roof["unit"] == "scrape windows", roof
        assert 0 < roof["counted"] <= roof["of"], roof
        assert roof["flops"] > 0 and roof["read_bytes"] > 0, roof
        assert roof["flops_per_s"] == pytest.approx(roof["flops"] / roof["seconds"])
        assert roof["intensity_flops_per_byte"] == pytest.approx(
            roof["flops"] / (roof["read_bytes"] + roof["write_bytes"])
        )
    refused = subprocess.run(
        [kvscope, "generate", "--url", vllm_server.url, "--max-model-len", "512"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("kvscope: Bad value for --max-model-len")
    assert "Traceback" not in refused.stderr


async def test_connection_lost_then_reattach(remote: RemoteEngine, vllm_server: VllmServer) -> None:
    ids = remote.synthetic_prompt(200, seed=99)
    request = GenerationRequest(
        "cut", prompt_token_ids=ids, sampling=SamplingSettings(600, ignore_eos=True)
    )
    tokens: list[TokenEvent] = []
    # The error comes mid-stream, after tokens: the whole loop belongs in the block.
    with pytest.raises(ConnectionLost) as info:  # noqa: PT012
        async for event in remote.stream(request):
            if isinstance(event, TokenEvent):
                tokens.append(event)
                if len(tokens) == 5:
                    await asyncio.to_thread(vllm_server.kill_hard)
    received = sum(len(t.token_ids) for t in tokens)
    assert received >= 5
    assert info.value.tokens_received == received
    assert f"lost after {received:,} tokens" in info.value.plain()
    assert wait_for(lambda: not remote.capabilities.reachable, 5)
    assert "re-attaches" in remote.capabilities.metrics_note
    with pytest.raises(ServerUnreachable) as down:
        await collect(remote.stream(chat("while-down", "Hi")))
    assert vllm_server.url in down.value.plain()

    attachments = remote.attachments
    began = time.perf_counter()
    vllm_server.start()
    print(f"\nvLLM server restarted in {time.perf_counter() - began:.1f} s")
    # The scraper dials again once a second while the server is down; a fresh server on a
    # loaded host answers its first scrape late (60 s: a hang guard).
    back = wait_for(lambda: remote.capabilities.reachable and remote.capabilities.metrics, 60)
    assert back, remote.capabilities
    assert remote.attachments == attachments + 1

    session = remote.new_session("after-restart")
    fin = finished(await collect(remote.stream(chat("back", LONG_CHAT, 8))))
    assert fin.output_tokens > 0

    def only_new_blocks() -> bool:
        sessions = {b.session_id for b in remote.prefix_cache().blocks}
        return sessions == {session}

    # The restarted server's cache is empty: the index forgot the old blocks.
    assert wait_for(only_new_blocks, 5), remote.prefix_cache().by_session()
