"""`kvscope bench` in load mode as a user runs it: on the fake engine, with its files, and
absurd flags refused in one line before any engine starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_helpers import KVSCOPE, one_line

ROOT = Path(__file__).resolve().parents[1]


def bench(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KVSCOPE, "bench", "--fake", *flags], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_a_fake_load_run_prints_the_table_and_writes_private_files(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    run = bench(
        "--concurrency", "1,2", "--prompt-lens", "64", "--output-len", "4",
        "--num-prompts", "4", "--warmup", "0", "--seed", "11", "--json", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "1 user" in run.stdout and "2 users" in run.stdout
    assert "--seed 11 repeats them" in run.stdout
    data = json.loads(out.read_text())
    assert data["seed"] == 11 and data["complete"] is True
    assert [p["max_concurrency"] for p in data["points"]] == [1, 2]
    assert os.stat(out).st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--request-rate", "-1"], "--request-rate: -1 is not a positive rate"),
        (["--goodput", "ttft:abc"], "--goodput: 'abc' in 'ttft:abc' is not a number"),
        (["--concurrency", "100000000"], "--concurrency: 100,000,000 is past the limit"),
        (["--concurrency", "1,100000000"], "100,000,000 users is past the limit of 4,096"),
        (["--request-rate", "inf", "--duration", "5"], "a rate of inf sends everything"),
        (["--find-max"], "give --goodput"),
        (["--burstiness", "0.5"], "--burstiness: it shapes an open loop"),
    ],
)
def test_absurd_load_flags_fail_in_one_line(flags: list[str], says: str) -> None:
    run = bench(*flags)
    assert run.returncode == 1
    one_line(run.stderr, says)
