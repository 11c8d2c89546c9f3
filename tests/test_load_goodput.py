"""Goodput as `vllm bench serve` counts it, on constructed requests."""

from __future__ import annotations

import pytest

from bench.goodput import RequestSlo, goodput, parse_goodput
from engine.errors import BadOption

# (ttft_s, e2e_s, output_tokens)
REQUESTS = [
    (0.5, 2.5, 21),  # tpot 100 ms: on the limit, which counts as within (<=)
    (0.5, 3.0, 21),  # tpot 125 ms: over
    (2.5, 3.0, 11),  # ttft over
    (1.0, 1.0, 1),  # one token: tpot counts as 0, as vLLM's goodput does
    (2.0, 4.0, 21),  # ttft on the limit
]


def slos() -> list[RequestSlo]:
    return [RequestSlo.of(t, e, n) for t, e, n in REQUESTS]


def test_parse_takes_vllms_syntax() -> None:
    assert parse_goodput(["ttft:2000", "tpot:100", "E2EL:5e3"]) == {
        "ttft": 2000.0,
        "tpot": 100.0,
        "e2el": 5000.0,
    }


@pytest.mark.parametrize(
    ("pairs", "says"),
    [
        (["ttft:abc"], "'abc' in 'ttft:abc' is not a number"),
        (["ttft"], "not KEY:MS"),
        (["itl:5"], "'itl' is not one of ttft, tpot, e2el"),
        (["ttft:-1"], "cannot be negative"),
        ([], "at least one"),
    ],
)
def test_parse_refuses_in_one_sentence(pairs: list[str], says: str) -> None:
    with pytest.raises(BadOption) as info:
        parse_goodput(pairs)
    assert info.value.option == "--goodput"
    assert says in info.value.plain()


def test_goodput_counts_requests_within_every_objective() -> None:
    g = goodput(slos(), {"ttft": 2000.0, "tpot": 100.0}, duration_s=10.0)
    assert g.good == 3  # the first, the one-token reply, the one on the TTFT limit
    assert g.request_goodput == pytest.approx(0.3)
    assert g.within == {"ttft": pytest.approx(0.8), "tpot": pytest.approx(0.8)}
    assert g.all_within == pytest.approx(0.6)
    assert goodput(slos(), {"e2el": 2500.0}, 10.0).good == 2


def test_the_same_requests_give_vllms_request_goodput() -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve") if False else None
    del serve  # importing vLLM costs seconds: vLLM's rule is restated below instead
    # vLLM (benchmarks/serve.py, calculate_metrics): for each successful request,
    # is_good = all(slo >= metric); tpot = (latency - ttft) / (output_len - 1), and 0
    # when output_len <= 1; request_goodput = good_completed / dur_s.
    limits = {"ttft": 2.0, "tpot": 0.1}
    good = 0
    for ttft, e2e, n in REQUESTS:
        tpot = (e2e - ttft) / (n - 1) if n > 1 else 0.0
        good += all(s >= m for s, m in zip(limits.values(), (ttft, tpot), strict=True))
    assert goodput(slos(), {"ttft": 2000.0, "tpot": 100.0}, 10.0).good == good
