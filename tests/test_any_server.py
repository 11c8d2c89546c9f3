"""kvscope against a server that is not vLLM's: GuideLLM's mock (tests/mock_server.py),
unmodified, with a set TTFT and ITL. It says no max_model_len, has no /metrics, no vLLM
/tokenize and takes no token-ID prompts: kvscope counts and builds prompts with a
tokenizer of its own, sends the OpenAI API's fields only, and says what it cannot see."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from cli_helpers import one_line, run_kvscope

from benchmarks.guidellm_mock import GUIDELLM, MockServer
from benchmarks.load_truth import ServerProcess, kvscope_process_round, vllm_round
from engine.events import ChatMessage
from engine.model_prep import embedded_model_dir
from engine.remote.client_tokenizer import ClientTokenizer
from engine.remote.prompts import RemotePrompts

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.skipif(
    not GUIDELLM.exists(), reason="no .venv-mock: `make setup` (scripts/setup.sh) makes it"
)

TTFT_MS, ITL_MS = 100.0, 10.0
NOT_VLLM = "Not a vLLM server (no vLLM /tokenize)"


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServer]:
    server = MockServer(TTFT_MS, ITL_MS).start()
    try:
        yield server
    finally:
        server.stop()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def test_generate_sends_the_prompt_length_asked_for_and_says_what_the_server_does_not(
    mock: MockServer,
) -> None:
    out = run_kvscope(
        "generate", "--url", mock.url, "--prompt-tokens", "100", "--max-tokens", "8", "--json",
        env=_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    data = json.loads(out.stdout)
    assert (data["prompt_tokens"], data["output_tokens"]) == (100, 8)
    assert len(data["itl_s"]) == 7
    # The mock streams a token every ITL_MS after TTFT_MS: no reading can beat that.
    assert data["ttft_s"] >= TTFT_MS / 1000
    # Tokens that come in one read share its time, so on a loaded host a gap can read 0
    # (fresh clone P); the last token's time cannot shrink: the mock sends it TTFT + 7 ITLs
    # after the request (less a millisecond a sleep, for a timer that fires early).
    assert min(data["itl_s"]) >= 0
    assert data["ttft_s"] + sum(data["itl_s"]) >= (TTFT_MS + 7 * (ITL_MS - 1)) / 1000
    # What the server does not say is said "unknown", never made up.
    model = data["model"]
    assert model["max_model_len"] == 0
    assert {"max_model_len", "block_size", "total_blocks"} <= set(model["unknown"])
    lines = [x for x in out.stderr.splitlines() if x.startswith("kvscope: ")]
    attached = next(x for x in lines if x.startswith("kvscope: attached to"))
    assert "max_model_len unknown" in attached and "KV pool unknown" in attached
    assert any(NOT_VLLM in x for x in lines), lines
    # The mock's model name is no tokenizer here: kvscope's own counts, and it says so.
    assert any("No tokenizer for 'llama-3.1-8b-instruct'" in x for x in lines), lines


def test_a_tokenizer_that_does_not_load_is_one_line(mock: MockServer) -> None:
    out = run_kvscope(
        "generate", "--url", mock.url, "--tokenizer", "/nonexistent/tok", "--prompt-tokens", "8",
        env=_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    one_line(out.stderr, "--tokenizer", "/nonexistent/tok", besides=("kvscope: attached",))


def test_a_limit_given_by_flag_is_the_wall(mock: MockServer) -> None:
    out = run_kvscope(
        "generate", "--url", mock.url, "--max-model-len", "64", "--prompt-tokens", "64",
        env=_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert "64 tokens" in out.stderr and "at most 63" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_text_sent_for_token_ids_reads_back_as_the_same_ids() -> None:
    # A server that takes no token IDs is sent their text; the count is exact only if the
    # tokenizer reads that text back as the same IDs, template markers and all.
    tokenizer = ClientTokenizer.load(str(embedded_model_dir()), ())
    prompts = RemotePrompts(tokenizer)
    for n, seed in ((3, 1), (100, 2), (2000, 3)):
        ids = prompts.synthetic(n, suffix="Now count to ten.", seed=seed)
        assert len(ids) == n
        assert tokenizer.text_ids(tokenizer.text(ids)) == list(ids), n
    chat = prompts.chat_ids([ChatMessage("user", "hello there")])
    assert tokenizer.text_ids(tokenizer.text(chat)) == list(chat)


def test_a_load_points_clock_stops_with_its_last_reply(mock: MockServer) -> None:
    # `vllm bench serve` counts a run's duration from its first send to its last reply,
    # and its throughputs over that. kvscope's point waits for the server's last scrape
    # windows after that (up to 2 s on a server with no /metrics, as here): that wait is
    # not the point's, or its tokens/s fall (413 where vllm bench serve read 740 once).
    import asyncio

    from bench.load_result import LoadConfig
    from bench.load_runner import run_load
    from engine.remote.engine import RemoteEngine

    engine = RemoteEngine(mock.url, kv_events=None)
    engine.start()
    try:
        config = LoadConfig(
            mode="concurrency", levels=(4.0,), prompt_len=16, output_len=8, num_prompts=8,
            warmup=0,
        )  # fmt: skip
        (point,) = asyncio.run(run_load(engine, config)).points
    finally:
        engine.shutdown()
    assert point.completed == 8, point.error
    last = max(r["sent_s"] + r["e2e_s"] for r in point.requests)
    # The loop sees the last reply end within a token gap of the mock's (set, 10 ms).
    assert last <= point.duration_s <= last + ITL_MS / 1000, (point.duration_s, last)
    assert point.output_throughput == pytest.approx(64 / point.duration_s)


@pytest.mark.own_engine  # `vllm bench serve` imports vLLM, in its own process
def test_at_32_streams_kvscope_reads_the_mocks_timings_as_well_as_vllm_bench_serve() -> None:
    # The mock's own lag under 32 streams on this host is the tolerance: measured by
    # `vllm bench serve` in the same test, beside kvscope's load runner, each client in a
    # process of its own. The two take turns (kvscope, vllm bench serve; again if not
    # close), so each kvscope round has a vllm bench serve round next to it on a host as
    # busy; kvscope must be within that one's error in at least one pair. An
    # ITL of 40 ms (800 tokens/s asked of the mock, not 3,200) keeps the mock on time on
    # a 2-core host, and the margin is a tenth of it, as +1 ms was of 10 ms.
    ttft_ms, itl_ms = TTFT_MS, 4 * ITL_MS
    users, output, prompts = 32, 32, 64
    tokens = prompts * output
    pairs: list[tuple[dict[str, float] | str, dict[str, float] | str]] = []
    close: list[bool] = []

    def said() -> str:
        return "\n".join(f"kvscope {ours}\nvllm bench serve {theirs}" for ours, theirs in pairs)

    server = MockServer(ttft_ms, itl_ms).start()
    try:
        # A second pair only when the first was not close: a burst of another process's
        # work falls in one pair, and a reading that is off by itself is off in both.
        while len(pairs) < 2 and not any(close):
            ours = kvscope_process_round(server.url, users, output, prompts)
            theirs = vllm_round(server.url, users, output, prompts)
            pairs.append((ours, theirs))
            assert isinstance(ours, dict), ours
            assert isinstance(theirs, dict), theirs
            # Neither client can see a token before the mock sends it.
            assert ours["median_ttft_ms"] >= ttft_ms and ours["median_itl_ms"] > 0, said()
            their_itl_error = abs(theirs["median_itl_ms"] - itl_ms)
            # The mean TTFT, not the median: 64 requests at 32 streams are two waves of 32,
            # the first late by the mock's accepting 32 at once (135-168 ms to both clients,
            # the second 103-116), so the median is the midpoint of the gap between the
            # waves and jumps ~20 ms when one request crosses it (kvscope 137.6 beside
            # vLLM's 117.8 once, with the same waves).
            their_ttft_error = theirs["mean_ttft_ms"] - ttft_ms
            ttft_slack = 0.5 * their_ttft_error + 0.1 * ttft_ms  # ours past theirs, allowed
            itl_slack = their_itl_error + 0.1 * itl_ms
            # Both clocks run from the first send to the last reply: two waves of requests,
            # each TTFT + (output - 1) gaps, so ours may run past theirs by twice the slacks.
            their_s = tokens / theirs["output_throughput"]
            our_s = tokens / ours["output_throughput"]
            close.append(
                abs(ours["median_itl_ms"] - itl_ms) <= itl_slack
                and ours["mean_ttft_ms"] - theirs["mean_ttft_ms"] <= ttft_slack
                and our_s - their_s <= 2 * (ttft_slack + (output - 1) * itl_slack) / 1000
            )
    finally:
        server.stop()
    assert any(close), said()


def test_walls_nobody_told_are_not_drawn_and_the_card_says_unknown() -> None:
    import dataclasses

    from engine.fake import FakeEngine
    from tui.widgets.prompt_length_slider import walls_for

    card = FakeEngine().start()
    assert {w.kind for w in walls_for(card, 1)} >= {"max_model_len", "kv_pool"}
    assert card.nearest_known_limit == min(card.max_model_len, card.kv_pool_tokens)
    # A server that says neither its context limit nor its pool (GuideLLM's mock).
    silent = dataclasses.replace(
        card, max_model_len=0, total_blocks=0, block_size=0, kv_capacity_tokens=0,
        unknown=("max_model_len", "block_size", "total_blocks"),
    )  # fmt: skip
    assert walls_for(silent, 1) == []
    assert silent.nearest_known_limit is None
    pool_only = dataclasses.replace(card, max_model_len=0, unknown=("max_model_len",))
    assert [w.kind for w in walls_for(pool_only, 1)] == ["kv_pool"]
    assert pool_only.nearest_known_limit == card.kv_pool_tokens


def test_find_max_against_a_server_of_four_slots_lands_on_the_capacity_its_timings_imply(
    tmp_path: Path,
) -> None:
    # GuideLLM's mock has --max-concurrent-requests, but its semaphore is released when the
    # handler returns a streaming response, before the stream is sent: it never binds a
    # streamed request (read in guidellm 0.8.1's mock_server/server.py; measured: the same
    # find-max with and without it found 19.5 requests/s, the host's own limit). So the
    # slots are kvscope's timed server's (benchmarks/timed_server.py --max-streams).
    # Four slots, each held for TTFT + (N-1) x ITL: at most 4 / (0.2 + 9 x 0.08) = 4.3
    # requests/s, whatever the client: a fifth of the 19.5 one client and server managed
    # unlimited on a busy 2-core host (an ITL of 20 ms put it at 10.5, half of that).
    # Arrivals at a constant rate queue only past it; past it by a share x, a 3 s point
    # ends with x x 3 s of backlog, so a TTFT objective of 3x the set TTFT fails just above
    # it at any capacity. The search starts at the same share of it as before (4 of 10.5).
    slots, output, ttft_ms, itl_ms = 4, 10, 200.0, 80.0
    capacity = slots / ((ttft_ms + (output - 1) * itl_ms) / 1000)
    server = ServerProcess(ttft_ms, itl_ms, max_streams=slots)
    try:
        out = run_kvscope(
            "bench", "--url", server.url, "--find-max", "--request-rate",
            f"{capacity * 4 / 10.5:.2f}",
            "--arrival", "constant", "--duration", "3", "--prompt-lens", "32",
            "--output-len", str(output), "--goodput", f"ttft:{3 * ttft_ms:.0f}",
            "--json", str(tmp_path / "r.json"),
            env=_env(), timeout=300,
        )  # fmt: skip
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    found = json.loads((tmp_path / "r.json").read_text())["find_max"]
    said = json.dumps(found, indent=1)
    assert found["mode"] == "rate" and found["best"] is not None, said
    assert abs(found["best"] - capacity) <= 0.15 * capacity, (capacity, said)
    # It says why the next rate up failed: the queue grew, or TTFT went over the objective.
    assert found["next_failure"], said
    assert "over-saturated" in found["next_failure"] or "over 600 ms" in found["next_failure"]
    assert found["sentence"] in " ".join(out.stdout.split()), out.stdout[-2000:]


def test_attaching_says_when_it_loads_a_tokenizer_of_its_own(mock: MockServer) -> None:
    # Loading one takes seconds (tens on a busy host): the screen says so, not the question
    # before it.
    from engine.remote.engine import RemoteEngine

    stages: list[str] = []
    engine = RemoteEngine(mock.url, kv_events=None)
    try:
        engine.start(lambda p: stages.append(p.stage))
    finally:
        engine.shutdown()
    loading = [s for s in stages if "loading a tokenizer" in s]
    assert loading == ["not vLLM: loading a tokenizer here (llama-3.1-8b-instruct)"], stages
    assert stages.index(loading[0]) > stages.index("asking which API the server speaks")


def test_a_mock_that_fails_after_six_requests_is_counted_per_point_and_kept(
    tmp_path: Path,
) -> None:
    # GuideLLM's own failure mode: HTTP 500 for every generation request after the sixth.
    # One user then four, four requests each: 4 good, then 2 good and 2 failed.
    failing = MockServer(TTFT_MS, ITL_MS, ("--fail-after-requests", "6")).start()
    try:
        out = run_kvscope(
            "bench", "--url", failing.url, "--concurrency", "1,4", "--num-prompts", "4",
            "--prompt-lens", "16", "--output-len", "4", "--warmup", "0",
            "--goodput", "ttft:60000", "--json", str(tmp_path / "r.json"),
            env=_env(), timeout=300,
        )  # fmt: skip
    finally:
        failing.stop()
    assert out.returncode == 3, out.stderr[-3000:]  # "some requests failed", in --help
    assert "Traceback" not in out.stderr
    points = json.loads((tmp_path / "r.json").read_text())["points"]
    assert [(p["completed"], p["failed"]) for p in points] == [(4, 0), (2, 2)], points
    assert points[1]["failed_by_cause"] == {"HTTP 500": 2}, points[1]
    assert points[0]["ok"] and not points[1]["ok"]
    # Both points kept, each request of the failing one too, with its cause.
    assert [len(p["requests"]) for p in points] == [4, 4]
    # A failed request misses every objective: half of the second point's met them.
    assert [p["slo_all_within"] for p in points] == [1.0, 0.5], points
    assert "2 of 4" in out.stdout
