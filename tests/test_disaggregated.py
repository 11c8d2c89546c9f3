"""Prefill here, decode there, on a real pair of CPU vLLM servers (tests/real_pd.py): the
prompt prefilled on one, its KV handed over by vLLM's ExampleConnector, decoded on the
other, with kvscope as the proxy (`--prefill URL --decode URL`).

One pair per module (two servers cost CI a minute): its tests run in one worker, the
prefill server's kill last.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest
from cli_helpers import run_kvscope
from real_pd import RealPair, running_pair
from remote_server import model_dir
from test_disaggregated_views import _flags as attach_flags

from bench.records import request_record
from cli.attach import check_replicas, make_fleet, make_remote
from engine.errors import KvscopeError, ServerUnreachable
from engine.events import GenerationRequest, RequestFinished, SamplingSettings, TokenEvent
from engine.fleet.disaggregated import DisaggregatedEngine
from engine.model_geometry import read_attention_geometry
from engine.remote import RemoteEngine
from tui.widgets.reply_footer import anatomy_fields, footer_fields

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.fleet.fleet_engine import FleetEngine
    from engine.protocol import Engine

pytestmark = [pytest.mark.own_engine, pytest.mark.xdist_group("disaggregated")]

PROMPT_TOKENS = 300  # past several blocks of 32, as the issue asks
OUTPUT_TOKENS = 8
HANG_GUARD_S = 300.0  # a hang guard, not a speed: the command imports, attaches, runs


@pytest.fixture(scope="module")
def pair() -> Iterator[RealPair]:
    with running_pair() as p:
        print(f"\nprefill/decode pair up after {p.start_seconds:.1f} s")
        yield p


@pytest.fixture(scope="module")
def pd(pair: RealPair) -> Iterator[FleetEngine]:
    """kvscope attached as `--prefill URL --decode URL`, as the CLI builds it."""
    args = attach_flags(prefill=pair.prefill.url, decode=pair.decode.url)
    check_replicas(args)
    engine = make_fleet(args, make_remote(args, []))
    engine.start()
    yield engine
    engine.shutdown()


def _prompt(seed: int) -> tuple[int, ...]:
    """Token IDs no other test sends: nothing of it is in either server's prefix cache."""
    rng = random.Random(seed)
    return tuple(rng.randrange(1000, 20000) for _ in range(PROMPT_TOKENS))


class Reply(NamedTuple):
    ids: list[int]
    done: RequestFinished
    first_token_after_s: float  # from before stream() to the first token's event, here


async def _run(engine: Engine, rid: str, prompt: tuple[int, ...]) -> Reply:
    request = GenerationRequest(
        rid,
        prompt_token_ids=prompt,
        sampling=SamplingSettings(max_tokens=OUTPUT_TOKENS, ignore_eos=True),
    )
    ids: list[int] = []
    finished = None
    first = None
    began = time.perf_counter()
    async for ev in engine.stream(request):
        if isinstance(ev, TokenEvent):
            first = first or time.perf_counter() - began
            ids += ev.token_ids
        elif isinstance(ev, RequestFinished):
            finished = ev
    assert finished is not None and first is not None
    return Reply(ids, finished, first)


def _pair_of(engine: FleetEngine) -> DisaggregatedEngine:
    assert isinstance(engine.inner, DisaggregatedEngine)
    return engine.inner


async def test_a_prompt_prefilled_on_one_server_is_decoded_on_the_other_from_its_kv(
    pd: FleetEngine, pair: RealPair
) -> None:
    prompt = _prompt(3301)
    ids, done, first_token_after_s = await _run(pd, "pd-1", prompt)
    h = done.handoff
    assert h is not None and h.prefill_replica == "prefill" and h.decode_replica == "decode"
    block = pd.card.block_size if pd.card else 0
    assert block == 32  # tests/remote_server.py's --block-size
    # ExampleConnector keeps whole blocks, short of the last prompt token and the one
    # before it (its align_to_block_size(len - 1): (L - 2) // block x block, 288 of 300).
    expected = (PROMPT_TOKENS - 2) // block * block
    assert h.loaded_tokens == expected, h
    assert h.loaded_source == "decode's KV-connector counter"
    assert h.recomputed_tokens == PROMPT_TOKENS - expected
    assert not h.fell_back
    assert pair.stored_files(), "the prefill server wrote no KV to the shared folder"
    # What that KV weighs: the model's K and V a token, in the servers' float32, against
    # the decode server's pool bytes over its pool tokens (cache_config_info).
    geometry = read_attention_geometry(json.loads((Path(model_dir()) / "config.json").read_text()))
    per_token = geometry.kv_bytes_per_token(4)
    assert h.loaded_bytes == pytest.approx(expected * per_token, rel=1e-3), h
    assert h.transfer_s is None  # ExampleConnector times nothing of its own
    # The TTFT is the client's, from the ask to the decode server's first token: the
    # prefill server's whole answer, then the hand-off; the parts add up to it.
    assert done.ttft_s is not None and h.handoff_s is not None
    assert 0 < h.prefill_s < done.ttft_s <= first_token_after_s
    assert sum(s for _, s in h.parts()) == pytest.approx(done.ttft_s, rel=1e-9)
    terms = anatomy_fields(done)
    assert any(t.startswith("KV hand-off + first step on decode") for t in terms), terms
    assert h.words() in footer_fields(done)
    assert done.fleet is not None and done.fleet.served.startswith("served by decode")
    record = request_record(done)
    assert record["handoff"]["loaded_tokens"] == expected
    assert set(record["handoff"]["ttft_parts_s"]) == {name for name, _ in h.parts()}
    # The same greedy request served whole by one server (the prefill server, asked
    # without the hand-off) gives the same tokens: the KV that came over is the prompt's.
    whole = RemoteEngine(pair.prefill.url, kv_events=None)
    whole.start()
    try:
        alone = (await _run(whole, "whole-1", prompt)).ids
    finally:
        whole.shutdown()
    assert ids == alone and len(ids) == OUTPUT_TOKENS


async def test_a_decode_server_that_finds_no_kv_says_it_computed_the_prompt_again(
    pd: FleetEngine, pair: RealPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = _pair_of(pd)
    answer = proxy.prefill.answer

    async def and_lose_the_kv(*args: object, **kwargs: object) -> object:
        got = await answer(*args, **kwargs)  # type: ignore[arg-type]
        # The shared folder lost between the two: what a wrong path on the decode side,
        # or a prefill server's disk gone, look like to the decode server.
        for entry in pair.store.iterdir():
            shutil.rmtree(entry, ignore_errors=True)
        return got

    monkeypatch.setattr(proxy.prefill, "answer", and_lose_the_kv)
    done = (await _run(pd, "pd-lost", _prompt(3302))).done
    h = done.handoff
    assert h is not None and h.loaded_tokens == 0 and h.fell_back, h
    words = h.words()
    assert f"fell back to computing all {PROMPT_TOKENS:,} prompt tokens again" in words
    # Its cost: the hand-off term, which now holds the decode server's whole prefill.
    assert h.handoff_s is not None
    assert f"{h.handoff_s * 1000:,.0f} ms from prefill's answer to its first token" in words


def test_generate_with_prefill_and_decode_prints_the_handoff_in_its_json(pair: RealPair) -> None:
    """As a user runs it: `kvscope generate --prefill URL --decode URL --json`."""
    import os

    run = run_kvscope(
        "generate", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
        "--prompt-tokens", str(PROMPT_TOKENS), "--max-tokens", "4", "--kv-events", "off",
        "--json",
        env=dict(os.environ), timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    record = json.loads(run.stdout)
    handoff = record["handoff"]
    assert record["prompt_tokens"] == PROMPT_TOKENS
    assert handoff["prefill_replica"] == "prefill" and handoff["decode_replica"] == "decode"
    assert handoff["loaded_tokens"] is not None and handoff["loaded_tokens"] > 0, handoff
    assert sum(handoff["ttft_parts_s"].values()) == pytest.approx(record["ttft_s"], rel=1e-6)


def test_bench_on_a_server_without_flop_counters_says_which_flag_gives_them(
    pair: RealPair, tmp_path: Path
) -> None:
    """The pair's servers run without --enable-mfu-metrics (the session's shared server has
    it: test_remote_engine): an attached bench point then has no roofline figures, never
    zeros, and says which flag gives them."""
    import os

    from engine.remote.vllm_metrics import MFU_FLAG

    out = tmp_path / "bench.json"
    run = run_kvscope(
        "bench", "--url", pair.decode.url, "--prompt-lens", "16", "--runs", "1",
        "--output-len", "2", "--kv-events", "off", "--json", str(out),
        env=dict(os.environ), timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["ok"], point
    roof = point["roofline"]
    assert MFU_FLAG in roof["missing"] and "flops" not in roof, roof
    assert MFU_FLAG in run.stdout + run.stderr  # said on screen too, not only in the file


async def test_a_prefill_server_gone_is_said_and_nothing_reaches_the_decode_server(
    pd: FleetEngine, pair: RealPair
) -> None:
    pair.prefill.kill_hard()
    with pytest.raises(KvscopeError) as raised:
        await _run(pd, "pd-down", _prompt(3303))
    assert isinstance(raised.value, ServerUnreachable), raised.value
    words = raised.value.plain()
    assert pair.prefill.url in words and "it is the prefill server (prefill)" in words
    assert "nothing was sent to the decode server (decode)" in words


NIXL_PAGE = """\
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} %d
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} %f
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} %d
"""


def test_nixls_own_transfer_time_and_bytes_split_the_handoff() -> None:
    """Read, not run: no NIXL on a CPU. The counters as vLLM's NixlPromMetrics names them
    (distributed/kv_transfer/kv_connector/v1/nixl/stats.py), moved by one request."""
    from engine.events import HandOff
    from engine.fleet.disaggregated import DecodeCounters, _delta

    before = DecodeCounters.parse(NIXL_PAGE % (100, 1.0, 1000))
    after = DecodeCounters.parse(NIXL_PAGE % (388, 1.25, 1000 + 288 * 46080))
    moved = _delta(before, after, lambda c: c.transfer_s)
    assert moved == pytest.approx(0.25)
    assert _delta(before, after, lambda c: c.external_tokens) == 288
    h = HandOff(
        "p", "d", 300, prefill_s=0.5, handoff_s=0.4, loaded_tokens=288, loaded_source="x",
        block_size=32, transfer_s=moved, transfer_bytes=288 * 46080,
    )  # fmt: skip
    assert dict(h.parts())["KV transfer to d"] == pytest.approx(0.25)
    assert dict(h.parts())["first step on d"] == pytest.approx(0.15)
    assert h.loaded_bytes == 288 * 46080
