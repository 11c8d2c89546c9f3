"""Prefill here, decode there (#33), as the screens show it, with no server: the fleet
view's two rows named by role, the request timeline's row in P and D segments, and the
words when the decode server recomputed the prompt. The real pair is in
tests/test_disaggregated.py.
"""

from __future__ import annotations

import argparse

import pytest

from cli.attach import check_replicas, make_fleet, make_remote
from engine.events import (
    HandOff,
    RequestAccepted,
    RequestFinished,
    StepSample,
)
from engine.remote.timeouts import DEFAULT_TIMEOUTS
from tui.telemetry.buffers import Telemetry
from tui.widgets.request_timeline import GLYPHS, lay_out

# Nothing listens there: the fleet is built, never started.
P_URL, D_URL, ROUTER_URL = "http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"


def _flags(**given: object) -> argparse.Namespace:
    """What the attach flags parse to: their defaults, and `given`."""
    flags: dict[str, object] = dict(
        url=None,
        prefill=None,
        decode=None,
        replica=[],
        replica_kv_events=[],
        router_metrics=None,
        kv_events="off",
        api_key=None,
        served_model_name=None,
        timeout=DEFAULT_TIMEOUTS,
        tokenizer=None,
    )
    flags.update(given)
    return argparse.Namespace(**flags)


@pytest.mark.parametrize("router", [None, ROUTER_URL], ids=["kvscope-proxies", "vllm-router"])
def test_both_servers_are_rows_of_the_fleet_view_named_by_role(router: str | None) -> None:
    """`--prefill URL --decode URL`, with kvscope as the proxy or behind vllm-router's PD
    mode (`--url`): either way kvscope scrapes both servers, one row each, by role."""
    args = _flags(url=router, prefill=P_URL, decode=D_URL)
    check_replicas(args)
    fleet = make_fleet(args, make_remote(args, []))
    state = fleet.fleet_state()
    assert [(r.name, r.url) for r in state.rows] == [("prefill", P_URL), ("decode", D_URL)]
    if router is None:
        assert "prefill/decode proxy" in state.routing
        assert "prefilled on prefill" in state.routing and "decoded there" in state.routing
    else:
        assert fleet.router_url == router and router in state.routing


def _remote_sample() -> StepSample:
    """A /metrics scrape: tokens made, but no per-request work (what a server shows)."""
    return StepSample(
        step=1,
        started_at=0.0,
        duration_s=1.0,
        prefill_tokens=300,
        decode_tokens=8,
        running=1,
        waiting=0,
        kv_usage=0.1,
        free_blocks=90,
        total_blocks=100,
        block_size=32,
        work=(),
    )


def _handoff(**given: object) -> HandOff:
    fields: dict[str, object] = dict(
        prefill_replica="prefill",
        decode_replica="decode",
        prompt_tokens=300,
        prefill_s=0.5,
        handoff_s=0.25,
        loaded_tokens=288,
        loaded_source="decode's KV-connector counter",
        block_size=32,
    )
    fields.update(given)
    return HandOff(**fields)  # type: ignore[arg-type]


def _finished(rid: str, handoff: HandOff | None) -> RequestFinished:
    # Asked at 10.0: P answered at 10.5, D's first token at 10.75, its last at 11.75.
    return RequestFinished(
        rid, "length", 300, 8, ttft_s=0.75, itl_s=(0.125,) * 7, e2e_s=1.75, handoff=handoff
    )


def test_the_timeline_draws_a_pairs_request_as_one_row_of_p_and_d_segments() -> None:
    tel = Telemetry()
    tel.add_sample(_remote_sample())
    assert "remote server" in lay_out(tel, 60, 6).plain()  # nothing finished yet
    tel.add_accepted(RequestAccepted("pd-1", 300, 10.0))
    tel.add_finished(_finished("pd-1", _handoff()))
    row = tel.timeline.row("pd-1")
    assert row is not None and row.servers == ("prefill", "decode")
    assert [(s.start, s.end, s.kind) for s in row.segments] == [
        (10.0, 10.5, "prefill"),
        (10.5, 10.75, "handoff"),
        (10.75, 11.75, "decode"),
    ]
    layout = lay_out(tel, 5 + 56, 6)  # "pd-1 ", and 56 columns of 1/32 s
    assert layout.rows == ("pd-1",)
    bar = layout.plain().splitlines()[1][5:]
    # 16 columns of prefill on P, 8 of hand-off, 32 of decode on D, each server's opened
    # by its letter.
    assert (
        bar == "P" + GLYPHS["prefill"] * 15 + GLYPHS["handoff"] * 8 + "D" + GLYPHS["decode"] * 31
    ), bar
    assert "P=prefill ▒=KV D=decode" in layout.title


def test_a_remote_servers_own_request_keeps_no_row_beside_a_pairs() -> None:
    """On a plain remote server nothing changes: a finish without a hand-off draws no row."""
    tel = Telemetry()
    tel.add_sample(_remote_sample())
    tel.add_accepted(RequestAccepted("plain", 300, 10.0))
    tel.add_finished(_finished("plain", None))
    assert "remote server does not show its steps" in lay_out(tel, 60, 6).plain()
    tel.add_accepted(RequestAccepted("pd-2", 300, 12.0))
    tel.add_finished(_finished("pd-2", _handoff()))
    assert lay_out(tel, 60, 6).rows == ("pd-2",)


def test_a_decode_server_that_found_no_kv_says_it_fell_back_and_what_that_cost() -> None:
    h = _handoff(loaded_tokens=0, handoff_s=0.4125)
    assert h.fell_back
    assert h.words() == (
        "decode found none of prefill's KV: it fell back to computing all 300 prompt tokens "
        "again, 412 ms from prefill's answer to its first token (decode's KV-connector "
        "counter)"
    )
    # No token from the decode server: no cost to name; the rest is said.
    none = _handoff(loaded_tokens=0, handoff_s=None).words()
    assert none.startswith("decode found none of prefill's KV") and " ms " not in none


# The README's run (2026-12-04): colocated, then the P/D pair.
COLOCATED = {
    "median_ttft_ms": 2279.2,
    "p99_ttft_ms": 4555.6,
    "median_itl_ms": 67.3,
    "p99_itl_ms": 1396.9,
    "output_throughput": 21.7,
}
PD = {
    "median_ttft_ms": 4545.1,
    "p99_ttft_ms": 9030.1,
    "median_itl_ms": 68.4,
    "p99_itl_ms": 499.9,
    "output_throughput": 22.9,
}


def test_the_benchmark_says_what_its_run_showed_and_why() -> None:
    from benchmarks.disaggregated import WHY, verdict

    assert verdict(COLOCATED, PD) == (
        "What this run showed: better with P/D: p99 ITL ms 0.36x of colocated; worse: "
        "median TTFT ms 1.99x, p99 TTFT ms 1.98x; no gain here: median ITL ms 1.02x, "
        f"output tok/s 1.06x (within 10%). {WHY}"
    )
    # Nothing better: said first, in the words.
    even = verdict(COLOCATED, {k: v * 1.05 for k, v in COLOCATED.items()})
    assert even.startswith("What this run showed: no gain here from splitting"), even
    assert "two cores" in WHY


async def test_a_prefill_server_that_dies_mid_prefill_is_said_and_decode_never_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection to P breaks while it prefills (the process killed, say): the line
    names P's role, and the decode server gets nothing (the real pair's test covers P
    refusing the connection: tests/test_disaggregated.py)."""
    from engine.errors import ConnectionLost
    from engine.events import GenerationRequest, SamplingSettings
    from engine.fleet.disaggregated import DisaggregatedEngine
    from engine.remote import RemoteEngine

    prefill, decode = RemoteEngine(P_URL, kv_events=None), RemoteEngine(D_URL, kv_events=None)
    pair = DisaggregatedEngine(("prefill", prefill), ("decode", decode))
    asked: list[object] = []

    async def dies(*args: object, **kwargs: object) -> object:
        raise ConnectionLost(0, P_URL, "peer closed connection")

    async def no_metrics(path: str) -> None:
        return None

    def decode_stream(*args: object, **kwargs: object) -> object:
        asked.append(args)
        raise AssertionError("the decode server was asked")

    monkeypatch.setattr(prefill, "answer", dies)
    monkeypatch.setattr(decode, "fetch_text", no_metrics)
    monkeypatch.setattr(decode, "stream", decode_stream)
    request = GenerationRequest("pd-dies", prompt_token_ids=(1, 2, 3), sampling=SamplingSettings())
    with pytest.raises(ConnectionLost) as raised:
        async for _ in pair.stream(request):
            pass
    words = raised.value.plain()
    assert words.startswith(f"Connection to {P_URL} lost after 0 tokens (peer closed connection; ")
    assert "it is the prefill server (prefill), so nothing was sent to the decode server" in words
    assert not asked


def test_a_pair_that_does_not_start_names_the_server_by_role_and_the_other_ones_state() -> None:
    """Both servers down: the decode server (attached first) is named by its role, and the
    words say the prefill server does not answer either, so a user fixes both at once."""
    from engine.errors import ServerUnreachable

    args = _flags(prefill=P_URL, decode=D_URL)
    check_replicas(args)
    fleet = make_fleet(args, make_remote(args, []))
    with pytest.raises(ServerUnreachable) as down:
        fleet.start()
    words = down.value.plain()
    assert down.value.url == D_URL, words
    assert "it is the decode server (decode) of the prefill/decode pair" in words, words
    assert f"the prefill server at {P_URL} does not answer either" in words, words
