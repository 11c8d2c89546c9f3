"""`kvscope bench --turns N --sessions M [--compare-urls ...]` as a user types it: a fake run
with its files, and every flag that makes no sense refused in one line before any engine
or server is touched."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_helpers import KVSCOPE, one_line

from cli.bench import add_bench_parser, run_bench
from cli.compare import parse_compare_urls
from engine.errors import BadOption

ROOT = Path(__file__).resolve().parents[1]


def _args(*flags: str) -> tuple[argparse.Namespace, list[str]]:
    top = argparse.ArgumentParser()
    parser = add_bench_parser(top.add_subparsers())
    args, engine_argv = parser.parse_known_args(list(flags))
    return args, engine_argv


def test_a_fake_chat_run_prints_the_turns_and_writes_private_files(tmp_path: Path) -> None:
    out, rows = tmp_path / "chat.json", tmp_path / "chat.csv"
    run = subprocess.run(
        [
            KVSCOPE, "bench", "--fake", "--turns", "3", "--sessions", "2", "--message-len", "6",
            "--output-len", "3", "--seed", "4", "--json", str(out), "--csv", str(rows),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "2 chat session(s) x 3 turn(s), 6-word messages, 3-token replies" in run.stdout
    assert "--seed 4 repeats them" in run.stdout
    data = json.loads(out.read_text())
    assert data["kind"] == "multi_turn" and data["completed"] == 6
    assert [t["turns"] for t in data["turns"]] == ["1", "2", "3"]
    assert len(rows.read_text().splitlines()) == 1 + 6
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert os.stat(rows).st_mode & 0o777 == 0o600


URLS = "a=http://127.0.0.1:1,b=http://127.0.0.1:2"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--turns", "0"], "--turns: must be at least 1 (got 0)"),
        (["--sessions", "5000"], "--sessions: 5,000 is not between 1 and 1,024"),
        (["--turns", "2", "--concurrency", "2"], "--concurrency: not with --turns/--sessions"),
        (["--turns", "2", "--request-rate", "1"], "--request-rate: not with --turns/--sessions"),
        (["--turns", "2", "--prompt-lens", "64"], "give --message-len"),
        (["--turns", "2", "--compare", "a", "b"], "for routers use --compare-urls"),
        (["--compare-urls", URLS], "--compare-urls: it compares multi-turn chats"),
        (["--fake", "--turns", "2", "--compare-urls", URLS], "not with --fake"),
        (["--turns", "2", "--compare-urls", URLS, "--max-model-len", "512"], "belong to the"),
        (["--turns", "2", "--compare-urls", URLS, "--url", "http://h:1"], "not with --url"),
        (
            ["--fake", "--turns", "40", "--message-len", "100"],
            "past the context limit (max_model_len) of 2,048",
        ),
    ],
)
def test_flags_that_make_no_sense_are_refused_before_anything_starts(
    flags: list[str], says: str
) -> None:
    args, engine_argv = _args(*flags)
    with pytest.raises(BadOption) as caught:
        run_bench(args, engine_argv)
    assert says in caught.value.plain()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("http://127.0.0.1:1", "1 URL(s) given; compare 2 to 8"),
        ("a=http://127.0.0.1:1,a=http://127.0.0.1:2", "two URLs are named 'a'"),
        ("a=ftp://h:1,b=http://127.0.0.1:2", "'ftp://h:1'"),
        ("9x=http://h:1,b=http://h:2", "'9x' is not a name"),
    ],
)
def test_bad_compare_urls_are_one_plain_reason(text: str, says: str) -> None:
    with pytest.raises(BadOption) as caught:
        parse_compare_urls(text)
    assert says in caught.value.plain()


def test_compare_urls_are_named_or_lettered_and_keep_no_password() -> None:
    urls = parse_compare_urls("http://u:secret@127.0.0.1:1, cache_aware=http://127.0.0.1:2/")
    assert [(name, url.root) for name, url in urls] == [
        ("A", "http://127.0.0.1:1"),
        ("cache_aware", "http://127.0.0.1:2"),
    ]
    assert urls[0][1].authorization is not None


def test_a_bad_flag_is_one_line_on_the_terminal() -> None:
    run = subprocess.run(
        [KVSCOPE, "bench", "--fake", "--turns", "2", "--duration", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    one_line(run.stderr, "--duration: not with --turns/--sessions")
