"""The remote engine's parts without a server: fixtures recorded from a real vLLM 0.32
server (tests/fixtures/remote/record.py), the import rule, and the gap replay over real
ZMQ sockets that speak vLLM's replay framing."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from remote_server import free_port

from engine.errors import ServerUnreachable
from engine.events import RequestAccepted, RequestFinished, TokenEvent
from engine.remote import RemoteEngine
from engine.remote.client import SseDecoder, normalize_url, parse_too_long, resolve_api_key
from engine.remote.kv_event_sources import KV_EVENTS_FLAGS, EventSource, plan_sources
from engine.remote.kv_event_subscriber import KvEventSubscriber
from engine.remote.kv_event_wire import decode_batch
from engine.remote.metrics import ScrapeState, cache_info, parse_metrics, step_sample
from engine.remote.prefix_cache_index import PrefixCacheIndex
from engine.remote.streaming import ReplyAssembler
from engine.request_book import RequestTimes

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "remote"


def recorded_events() -> list[dict[str, Any]]:
    lines = (FIXTURES / "kv_events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def payload(record: dict[str, Any]) -> bytes:
    return base64.b64decode(record["payload_b64"])


def test_remote_path_imports_without_vllm_or_torch() -> None:
    code = f"""
import sys
for name in ("vllm", "torch", "transformers"):
    sys.modules[name] = None  # any import of them now fails
import engine.remote
from engine.remote import RemoteEngine
from engine.remote.kv_event_wire import decode_batch
from engine.remote.metrics import cache_info, parse_metrics
from engine.errors import ServerUnreachable
import base64, json
text = open({str(FIXTURES / "metrics_busy.txt")!r}).read()
assert cache_info(parse_metrics(text)).block_size == 32
line = open({str(FIXTURES / "kv_events.jsonl")!r}).readline()
batch = decode_batch(base64.b64decode(json.loads(line)["payload_b64"]))
assert batch.events[0].kind == "BlockStored"
try:
    RemoteEngine("http://127.0.0.1:{free_port()}", kv_events=None).start()
except ServerUnreachable as exc:
    print("UNREACHABLE:" + exc.url)
heavy = sorted(
    m for m, mod in sys.modules.items()
    if mod is not None and m.split(".")[0] in ("vllm", "torch", "transformers", "textual", "tui")
)
print("LOADED:" + ",".join(heavy))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "UNREACHABLE:http://127.0.0.1:" in out.stdout
    assert "LOADED:\n" in out.stdout + "\n", out.stdout


def test_unreachable_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = RemoteEngine(url, kv_events=None)
    with pytest.raises(ServerUnreachable) as info:
        engine.start()
    assert info.value.url == url
    assert url in info.value.plain()
    assert "connection refused" in info.value.plain()
    with pytest.raises(ServerUnreachable):  # Ctrl+R: start() again simply tries again
        engine.start()


def test_urls_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    assert normalize_url("gpu-box:8000") == "http://gpu-box:8000"
    assert normalize_url("https://h.example/v1/") == "https://h.example"
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai")
    assert resolve_api_key(None) == "from-openai"
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert resolve_api_key(None) == "from-vllm"
    assert resolve_api_key("given") == "given"


def test_server_length_refusals_are_read() -> None:
    # vLLM 0.32's words (vllm/renderers/params.py and the max_tokens check).
    chat = parse_too_long(
        "This model's maximum context length is 1024 tokens. However, your prompt contains "
        "at least 1025 input tokens, which exceeds this limit even without any output tokens."
    )
    assert chat is not None
    assert chat.prompt_tokens is None
    assert chat.lower_bound == 1025
    ids = parse_too_long(
        "This model's maximum context length is 1024 tokens. However, your prompt contains "
        "1100 input tokens, which exceeds this limit even without any output tokens."
    )
    assert ids is not None
    assert (ids.prompt_tokens, ids.max_model_len) == (1100, 1024)
    full = parse_too_long("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)")
    assert full is not None
    assert full.max_model_len is None
    assert parse_too_long("The model `nope` does not exist.") is None


def test_recorded_kv_events_rebuild_the_index() -> None:
    index = PrefixCacheIndex()
    for record in recorded_events():
        batch = decode_batch(payload(record))
        assert batch.rank == 0
        index.apply(batch, 0, time.perf_counter())
    view = index.view(replayed=0, missed=0, receiving=True, note="")
    by_session = view.by_session()
    # chat-a: a ~260-token chat = 8 full blocks of 32; synthetic-b: 900 prompt tokens
    # plus decode fill 30 blocks; chat-c re-used chat-a's 8 blocks (prefix-cache hits).
    assert by_session == {"chat-a": 8, "synthetic-b": 30}
    assert view.stored_total == 38
    assert view.reused_total == 8
    reused = [b for b in view.blocks if b.touched_by == ("chat-a", "chat-c")]
    assert len(reused) == 8
    assert all(b.num_tokens == 32 and isinstance(b.block_hash, int) for b in view.blocks)
    chain = [b for b in view.blocks if b.session_id == "chat-a"]
    assert chain[0].parent_hash is None
    assert all(b.parent_hash == a.block_hash for a, b in itertools.pairwise(chain))


def test_recorded_metrics_make_scrape_samples() -> None:
    idle = parse_metrics((FIXTURES / "metrics_idle.txt").read_text())
    busy = parse_metrics((FIXTURES / "metrics_busy.txt").read_text())
    after = parse_metrics((FIXTURES / "metrics_after.txt").read_text())
    info = cache_info(busy)
    assert info is not None
    assert (info.block_size, info.num_gpu_blocks, info.total_blocks) == (32, 91, 90)
    assert info.prefix_caching is True
    assert info.engines == ("0",)

    state = ScrapeState()
    first = state.update(idle, 100.0, info)
    assert first.running == 0
    assert first.kv_usage == 0.0
    assert first.ttft.count == 0
    during = state.update(busy, 100.2, info)
    assert during.running == 1
    assert during.used_blocks == 29
    assert during.total_blocks == 90
    assert during.kv_usage == pytest.approx(29 / 90)  # the server's gauge, of its 90 blocks
    assert during.block_size == 32
    assert during.prompt_tokens == 1158  # the counter's growth since the idle scrape
    assert during.prompt_tokens_per_s > 0
    assert [r.engine for r in during.rows] == ["0"]
    step = step_sample(during)
    assert (step.free_blocks, step.total_blocks, step.running) == (61, 90, 1)
    assert step.blocks == ()  # no physical block IDs, ever

    end = state.update(after, 100.4, info)
    assert end.running == 0
    assert end.kv_usage == 0.0
    assert end.ttft.count == 3  # chat-a, synthetic-b and chat-c, since "attach"
    assert end.itl.count > 60
    assert end.itl.mean is not None
    median = end.ttft.quantile(0.5)
    assert median is not None
    # The recorded buckets hold the middle of the three TTFTs in (0.25 s, 0.5 s].
    assert 0.25 < median <= 0.5
    assert end.prefix_cache_hit_rate is not None
    assert end.prefix_cache_hit_rate > 0
    # A server that restarted: counters go back, deltas start again from the restart.
    again = state.update(idle, 100.6, info)
    assert again.server_restarted
    assert again.ttft.count == 0


def chat_chunks(pieces: list[bytes], start: float = 10.0) -> list[Any]:
    reply = ReplyAssembler(RequestTimes("r1", start))
    decoder = SseDecoder()
    events: list[Any] = []
    for i, piece in enumerate(pieces):
        for data in decoder.feed(piece):
            if data == "[DONE]":
                events.append(reply.finish(start + 1 + i))
            else:
                events += reply.on_chunk(json.loads(data), start + 0.1 + 0.01 * i)
    return events


def test_recorded_chat_stream_becomes_events() -> None:
    raw = (FIXTURES / "chat_stream.sse").read_bytes()
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)]  # reads cut events anywhere
    events = chat_chunks(pieces)
    assert isinstance(events[0], RequestAccepted)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    fin = events[-1]
    assert isinstance(fin, RequestFinished)
    assert fin.output_tokens == sum(len(t.token_ids) for t in tokens) == 24
    assert fin.reason == "length"
    assert fin.prompt_tokens == events[0].prompt_tokens
    assert fin.server is not None
    assert fin.server.ttft_s is not None
    assert fin.server.mean_itl_s is not None
    assert fin.server.cached_prompt_tokens == 0
    assert [t.index for t in tokens] == list(range(24))


def test_cached_prompt_tokens_are_kept_without_per_request_metrics() -> None:
    # A server with --enable-prompt-tokens-details but not --enable-per-request-metrics.
    usage = {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}
    chunks = [
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":'
        + json.dumps(usage).encode()
        + b"}\n\n",
        b"data: [DONE]\n\n",
    ]
    fin = chat_chunks(chunks)[-1]
    assert isinstance(fin, RequestFinished)
    assert fin.server is None  # no metrics object: no server timings
    assert fin.cached_prompt_tokens == 256
    assert fin.prompt_tokens == 300


def test_tokens_arriving_together_share_one_time() -> None:
    raw = (FIXTURES / "chat_stream.sse").read_bytes()
    events = chat_chunks([raw])  # the whole reply in one network read
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len({t.time_s for t in tokens}) == 1  # never spread out
    assert all(t.latency_s == 0 for t in tokens[1:])
    fin = events[-1]
    assert isinstance(fin, RequestFinished)
    assert set(fin.itl_s) == {0.0}


def test_event_sources_and_the_flag_to_turn_them_on() -> None:
    wildcard = {"0": {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}}  # fmt: skip
    sources, note = plan_sources(wildcard, "gpu-box")
    assert note == ""
    assert sources == [EventSource(0, "tcp://gpu-box:5557", False, "tcp://gpu-box:5558")]
    concrete = {"0": {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:25557"}}
    assert plan_sources(concrete, "127.0.0.1")[0] == [
        EventSource(0, "tcp://127.0.0.1:25557", True, None)
    ]
    none, note = plan_sources({}, "gpu-box")
    assert none == []
    assert KV_EVENTS_FLAGS in note
    assert "--enable-prefix-caching" in note
    off = {"0": {"enable_kv_cache_events": False, "publisher": "null"}}
    assert plan_sources(off, "gpu-box")[1] == note
    inproc = {"0": {"enable_kv_cache_events": True, "endpoint": "inproc://cache"}}
    assert "cannot reach" in plan_sources(inproc, "h")[1]


def test_gap_in_sequence_numbers_is_replayed() -> None:
    """A PUB and a ROUTER that speak vLLM 0.32's framing, fed recorded payloads."""
    records = recorded_events()[:4]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    # An XPUB is vLLM's PUB to the subscriber, and says when one has subscribed: the test
    # waits for that, not for a guess at ZMQ's slow joiner.
    pub, router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
    pub_port, replay_port = free_port(), free_port()
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    buffer: list[tuple[int, bytes]] = []
    stop = threading.Event()
    replays_served: list[int] = []  # the start seq of each replay answered

    def serve_replay() -> None:  # as ZmqEventPublisher._service_replay does
        while not stop.is_set():
            if router.poll(50):
                client, _, start = router.recv_multipart()
                for seq, data in list(buffer):
                    if seq >= int.from_bytes(start, "big"):
                        router.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), data])
                router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
                replays_served.append(int.from_bytes(start, "big"))

    server = threading.Thread(target=serve_replay, daemon=True)
    server.start()
    index = PrefixCacheIndex()
    source = EventSource(0, f"tcp://127.0.0.1:{pub_port}", False, f"tcp://127.0.0.1:{replay_port}")
    sub = KvEventSubscriber([source], index)
    try:
        assert sub.start() == ""
        # Two things happen at attach: the SUB subscribes, and the thread asks for a replay
        # of what the server held before (nothing yet). Both are waited for, not slept on.
        assert pub.poll(60_000), "the subscriber never connected"
        assert pub.recv()[:1] == b"\x01"  # its subscription: what is sent now arrives
        deadline = time.monotonic() + 60
        while not replays_served:
            assert time.monotonic() < deadline, "the attach-time replay was never asked for"
            time.sleep(0.01)

        def publish(seq: int, live: bool) -> None:
            buffer.append((seq, payload(records[seq])))
            if live:
                pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload(records[seq])])

        publish(0, True)
        publish(1, False)  # lost on the way: only the replay buffer has 1 and 2
        publish(2, False)
        publish(3, True)
        # A hang guard like the waits above (the round trip is milliseconds when it works).
        deadline = time.monotonic() + 60
        while index.batches < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.batches == 4, (index.batches, sub.replayed, sub.missed, sub.problem)
        assert sub.missed == 0
        assert sub.replayed >= 2
        assert index.view(replayed=0, missed=0, receiving=True, note="").by_session() == {
            "chat-a": 8,
            "synthetic-b": 30,
        }
    finally:
        sub.stop()
        stop.set()
        server.join(timeout=5)
        pub.close(linger=0)
        router.close(linger=0)
        ctx.term()


def test_one_row_per_engine_label() -> None:
    """Two data-parallel engines: the recorded text with every engine="0" row doubled as
    engine="1" (the layout vLLM gives a DP deployment: one label per rank)."""
    lines = []
    for line in (FIXTURES / "metrics_busy.txt").read_text().splitlines():
        lines.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    parsed = parse_metrics("\n".join(lines) + "\n")
    info = cache_info(parsed)
    assert info is not None
    assert info.engines == ("0", "1")
    # num_gpu_blocks is the sum over ranks: each has half, less its null block.
    assert info.blocks_per_engine == 91 // 2 - 1
    assert info.total_blocks == 2 * (91 // 2 - 1)
    sample = ScrapeState().update(parsed, 1.0, info)
    assert [r.engine for r in sample.rows] == ["0", "1"]
    assert sample.running == 2
    assert all(r.running == 1 for r in sample.rows)
    assert sample.used_blocks == sum(r.used_blocks for r in sample.rows)


def test_remote_engine_keeps_to_the_engine_protocol() -> None:
    from engine.protocol import Engine

    engine = RemoteEngine("http://127.0.0.1:1", kv_events=None)
    assert isinstance(engine, Engine)
    assert engine.remote
    assert engine.card is None
