"""`kvscope bench --url` load runs through a hostile server (tests/hostile_server.py): HTTP
500s after N requests, streams cut mid-event, streams that stall until the timeout, and a
replica that dies mid-run. Every point says how many of its requests failed and why, on
screen and in the JSON; failed requests stay in `requests` with what they got; goodput
counts them as missing; the closing sentence names them first; the exit status is 3.

The command runs as a user runs it, in a subprocess against the server on loopback. The
objective is generous (ttft:120000, past the 60 s first-byte timeout), so a completed
request always meets it and only the failures decide the shares: no test reads a time off
this machine.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import KVSCOPE
from hostile_server import HostileServer

from bench.goodput import RequestSlo, goodput
from bench.sweep_files import saved_load_from_json

ROOT = Path(__file__).resolve().parents[1]
SLO = "ttft:120000"
EXIT_SOME_FAILED = 3


def bench(
    tmp_path: Path, target: list[str], *flags: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The load through `target` (--url URL, or --replica ...); its run and its JSON."""
    out = tmp_path / "load.json"
    run = subprocess.run(
        [
            KVSCOPE, "bench", *target, "--prompt-lens", "16", "--output-len", "4",
            "--warmup", "0", "--seed", "1", "--goodput", SLO, "--json", str(out), *flags,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert out.exists(), run.stderr[-3000:]
    return run, json.loads(out.read_text())


def failures(point: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in point["requests"] if r.get("failure")]


def kvscope_lines(err: str) -> list[str]:
    """stderr's own lines, besides the attach and routing news."""
    news = ("kvscope: attached", "kvscope: routing:")
    return [x for x in err.splitlines() if x.startswith("kvscope: ") and not x.startswith(news)]


def test_http_500s_after_n_are_counted_on_every_point(tmp_path: Path) -> None:
    with HostileServer("fail_after", 10) as server:
        run, data = bench(
            tmp_path, ["--url", server.url], "--concurrency", "1,4", "--num-prompts", "8",
            "--csv", str(tmp_path / "load.csv"),
        )  # fmt: skip
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    one, four = data["points"]
    # The first 10 replies stream: 8 for one user, then 2 of the 4 users' 8.
    assert (one["completed"], one["failed"], one["ok"]) == (8, 0, True)
    assert (four["completed"], four["failed"], four["ok"]) == (2, 6, False)
    assert four["failed_by_cause"] == {"HTTP 500": 6}
    assert four["error"].startswith("6 of 8 requests failed (HTTP 500: 6)")
    # Failed requests stay in the list, each with its cause and the server's words.
    assert len(four["requests"]) == 8
    assert [r["failure"] for r in failures(four)] == ["HTTP 500"] * 6
    assert all("HTTP 500" in r["error"] for r in failures(four))
    # A failed request met no objective: 2 of 8 within, not 2 of 2.
    assert four["slo_all_within"] == pytest.approx(2 / 8)
    assert four["slo_ttft_within"] == pytest.approx(2 / 8)
    assert one["slo_all_within"] == pytest.approx(1.0)
    # On screen: the failed column on every row, the causes, and failures named first.
    rows = {line.split("│")[1].strip(): line for line in run.stdout.splitlines() if "│" in line}
    assert "0 of 8" in rows["1 user"] and "6 of 8" in rows["4"], run.stdout
    assert "4 users: 6 of 8 requests failed (HTTP 500: 6)" in run.stdout
    assert "6 requests failed, so those points measured the failures" in run.stdout
    assert "saturated" not in run.stdout
    (said,) = kvscope_lines(run.stderr)
    assert said.startswith("kvscope: 6 requests failed") and "exit status 3" in said
    assert "HTTP 500: 6" in (tmp_path / "load.csv").read_text()
    # A saved file gives the same counts back (the sweep screen's F9 reads it).
    saved = saved_load_from_json((tmp_path / "load.json").read_text()).result
    assert saved.points[1].failed_by_cause == {"HTTP 500": 6}


def test_http_500s_under_an_open_loop(tmp_path: Path) -> None:
    with HostileServer("fail_after", 5) as server:
        run, data = bench(tmp_path, ["--url", server.url], "--request-rate", "20",
                          "--num-prompts", "20")  # fmt: skip
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    (point,) = data["points"]
    assert (point["completed"], point["failed"]) == (5, 15)
    assert point["failed_by_cause"] == {"HTTP 500": 15}
    assert len(point["requests"]) == 20
    assert point["slo_all_within"] == pytest.approx(5 / 20)
    assert "20 req/s: 15 of 20 requests failed (HTTP 500: 15)" in run.stdout


@pytest.mark.parametrize(("users", "prompts"), [("1,4", 8), ("64", 64)])
def test_cut_streams_keep_their_partial_replies(tmp_path: Path, users: str, prompts: int) -> None:
    with HostileServer("cut", 2) as server:
        run, data = bench(tmp_path, ["--url", server.url], "--concurrency", users,
                          "--num-prompts", str(prompts))  # fmt: skip
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    for point in data["points"]:
        # Cut by the server, not aborted by kvscope: each one counted as failed.
        assert (point["completed"], point["failed"], point["aborted"]) == (0, prompts, 0)
        assert point["failed_by_cause"] == {"cut": prompts}
        assert point["request_goodput"] == 0.0 and point["slo_all_within"] == 0.0
        cut = failures(point)
        assert len(cut) == prompts
        # Two tokens came before each cut: the partial reply and its first token's time.
        assert all(r["output_tokens"] == 2 and r["ttft_s"] is not None for r in cut)
        assert all(r["failed_after_s"] >= r["ttft_s"] for r in cut)
    label = data["points"][0]["label"]
    assert f"{label}: failed: {prompts} of {prompts} requests failed (cut: {prompts})" in run.stdout
    assert "No point ran clean" in run.stdout


def test_stalled_streams_time_out_and_are_never_called_saturation(tmp_path: Path) -> None:
    # An open loop of stalled streams grows a queue of outstanding requests, as an
    # over-saturated engine does: the point must say timeouts, and run to its end.
    with HostileServer("stall", 2) as server:
        run, data = bench(tmp_path, ["--url", server.url], "--request-rate", "20",
                          "--num-prompts", "40", "--timeout", "30,30,1")  # fmt: skip
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    (point,) = data["points"]
    assert point["stopped_early"] is None, point["stopped_early"]
    assert (point["completed"], point["failed"], point["aborted"]) == (0, 40, 0)
    assert point["failed_by_cause"] == {"timeout": 40}
    stalled = failures(point)
    assert len(stalled) == 40 and all(r["output_tokens"] <= 2 for r in stalled)
    assert any(r["output_tokens"] == 2 and r["ttft_s"] is not None for r in stalled)
    assert "over-saturated" not in run.stdout and "knee" not in run.stdout
    assert "40 of 40 requests failed (timeout: 40)" in run.stdout


def test_a_server_that_dies_mid_run_is_named_down(tmp_path: Path) -> None:
    with HostileServer("die_after", 5) as server:
        run, data = bench(tmp_path, ["--url", server.url], "--concurrency", "1,4",
                          "--num-prompts", "8")  # fmt: skip
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    one, four = data["points"]
    assert (one["completed"], one["failed"]) == (5, 3)
    # The request in flight when it died is cut; after that nothing answers.
    assert set(one["failed_by_cause"]) <= {"cut", "replica down"}
    assert four["failed_by_cause"] == {"replica down": 8}
    assert f"replica down: No vLLM server answers at {server.url}" in run.stdout


def test_a_replica_that_dies_behind_a_round_robin_is_named(tmp_path: Path) -> None:
    with HostileServer("fail_after", 10**6) as a, HostileServer("die_after", 3) as b:
        target = ["--replica", f"a={a.url}", "--replica", f"b={b.url}"]
        run, data = bench(tmp_path, target, "--concurrency", "1,4", "--num-prompts", "8")
    assert run.returncode == EXIT_SOME_FAILED, run.stderr
    points = data["points"]
    assert all(p["completed"] + p["failed"] == 8 for p in points)
    failed = sum(p["failed"] for p in points)
    assert failed >= 1
    causes = {c for p in points for c in p["failed_by_cause"]}
    assert causes <= {"cut", "replica down"} and causes
    # Each failure names the replica that broke, never the healthy one.
    errors = [r["error"] for p in points for r in failures(p)]
    assert len(errors) == failed and all(b.url in e and a.url not in e for e in errors)
    (said,) = kvscope_lines(run.stderr)
    assert f"kvscope: {failed} request" in said


def test_help_documents_the_exit_status_of_failed_requests() -> None:
    run = subprocess.run(
        [KVSCOPE, "bench", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    text = " ".join(run.stdout.split())
    assert "3 when any request or point failed" in text
    assert "'N of M failed', by cause" in text


def test_goodput_counts_missed_requests_outside_every_objective() -> None:
    served = [RequestSlo.of(0.1, 0.5, 5), RequestSlo.of(0.2, 0.6, 5)]
    g = goodput(served, {"ttft": 1000.0}, 2.0, missed=6)
    assert g.good == 2 and g.request_goodput == pytest.approx(1.0)
    assert g.all_within == pytest.approx(2 / 8) and g.within == {"ttft": pytest.approx(2 / 8)}
    assert goodput([], {"ttft": 1000.0}, 2.0, missed=3).all_within == 0.0
