"""What `kvscope generate` records and prints for one finished request (cli/generate.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bench.records import request_record
from cli.generate import print_result
from engine.events import ReplicaServed, RequestFinished

if TYPE_CHECKING:
    import pytest


def finished(fleet: ReplicaServed | None) -> RequestFinished:
    return RequestFinished(
        "r1", "length", 12, 3, ttft_s=0.25, itl_s=(0.02, 0.04), e2e_s=0.31, fleet=fleet
    )


def test_a_fleet_request_names_its_replica_in_the_json_and_under_the_timings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = ReplicaServed(
        "b", "served by b (router counter)", "cache miss: prefix on a, sent to b"
    )
    record = request_record(finished(served))
    assert json.loads(json.dumps(record))["fleet"] == {
        "replica": "b",
        "served": "served by b (router counter)",
        "prefix": "cache miss: prefix on a, sent to b",
    }
    print_result(record, as_json=False)
    err = capsys.readouterr().err.splitlines()
    assert err[-2] == "TTFT 250.0 ms, median ITL 30.0 ms, 12 prompt + 3 output tokens"
    assert err[-1] == "cache miss: prefix on a, sent to b; served by b (router counter)"


def test_one_server_adds_no_fleet_line(capsys: pytest.CaptureFixture[str]) -> None:
    record = request_record(finished(None))
    assert "fleet" not in record
    print_result(record, as_json=False)
    assert capsys.readouterr().err.splitlines()[-1].startswith("TTFT 250.0 ms")
