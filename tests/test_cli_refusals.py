"""Combinations of flags that cannot mean what they say, refused in one plain line with the
numbers before anything starts (#31, items 3, 4 and 6): a list that a mode would drop, a
key given twice, one server compared with itself, a rate that never sends, and the words
of each refusal (not a number, more than 0, an empty name, a HOME that is not there).

Every run is the real `kvscope` command on the fake engine or against dead loopback
ports: no vLLM engine starts.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import TYPE_CHECKING

import pytest
from cli_helpers import one_line, run_kvscope

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

# A small load that the fake engine answers in well under a second per point.
SMALL = ("--prompt-lens", "32", "--output-len", "4", "--warmup", "0", "--seed", "3")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "KVSCOPE_CACHE_DIR": str(tmp_path / "cache"), **extra}
    env.pop("KVSCOPE_DEBUG", None)
    return env


def _kvscope(
    tmp_path: Path, *args: str, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    # Fresh: these refusals come before any engine, and a fork of the zygote (vLLM
    # imported) costs more than a fresh process that never imports it.
    return run_kvscope(*args, env=_env(tmp_path, **extra), timeout=timeout, fresh=True)


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- item 3: --find-max and the levels it claims -----------------------------------------------
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--concurrency", "1,2"], ("--find-max", "1,2", "--concurrency 1")),
        (["--request-rate", "1,2"], ("--find-max", "1,2", "--request-rate 1")),
    ],
)
def test_find_max_refuses_a_list_it_would_ignore(
    tmp_path: Path, flags: list[str], says: tuple[str, ...]
) -> None:
    run = _kvscope(
        tmp_path, "bench", "--fake", "--find-max", "--goodput", "ttft:100000", *flags, *SMALL
    )
    assert run.returncode == 1, run.stdout[-2000:]
    one_line(run.stderr, *says)
    assert run.stdout == ""


def test_find_max_never_claims_more_users_than_its_requests_had_in_flight(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r.json"
    prompts = 4
    run = _kvscope(
        tmp_path, "bench", "--fake", "--find-max", "--goodput", "ttft:100000",
        "--concurrency", "1", "--num-prompts", str(prompts), "--json", str(out), *SMALL,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    found = json.loads(out.read_text())
    best = found["find_max"]["best"]
    points = {p["max_concurrency"]: p for p in found["points"]}
    assert best is not None and best <= prompts, found["find_max"]
    # The level claimed is one its batch reached: that many requests were in flight at once.
    assert points[best]["max_concurrent_requests"] >= best
    assert max(points) <= prompts
    assert f"--num-prompts {prompts}" in run.stdout


def test_a_users_level_past_the_requests_it_sends_is_refused(tmp_path: Path) -> None:
    run = _kvscope(
        tmp_path, "bench", "--fake", "--concurrency", "1,8", "--num-prompts", "4", *SMALL
    )
    assert run.returncode == 1
    one_line(run.stderr, "--num-prompts", "4 requests a level", "8 users", "at least 8")


@pytest.mark.parametrize(
    ("levels", "says"),
    [
        ("1e-300 req/s", "load levels: 8 requests at 1e-300 requests/s"),
        ("1 2 4 16 users", "requests/level: 8 requests a level cannot keep 16 users busy"),
    ],
)
def test_the_playground_load_form_refuses_the_same_levels(levels: str, says: str) -> None:
    """The F5 load form is checked by the same validate as the flags: a rate that never
    sends and more users than requests are refused there too, in the form's words."""
    from tui.sweep.load_view_model import LoadForm, read_load_form

    with pytest.raises(ValueError, match=re.escape(says)) as refused:
        read_load_form(LoadForm(levels=levels), None, seed=1)
    assert "--" not in str(refused.value)


# -- item 4: nothing dropped in silence --------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--request-rate", "1,2"], ("--sweep", "--request-rate 1,2")),
        (["--concurrency", "4"], ("--sweep", "--concurrency 4")),
    ],
)
def test_sweep_refuses_levels_it_would_drop(
    tmp_path: Path, flags: list[str], says: tuple[str, ...]
) -> None:
    run = _kvscope(tmp_path, "bench", "--fake", "--sweep", *flags, *SMALL)
    assert run.returncode == 1
    one_line(run.stderr, *says, "chooses its own")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--concurrency", "1,2", "--runs", "5"], ("--runs", "5 runs", "--num-prompts")),
        (["--request-rate", "2", "--runs", "2"], ("--runs", "2 runs", "--duration")),
        (["--turns", "2", "--runs", "2"], ("--runs", "not with --turns/--sessions")),
        (["--turns", "2", "--hardware", "l4"], ("--hardware", "not with --turns/--sessions")),
    ],
)
def test_flags_of_another_mode_are_refused_not_dropped(
    tmp_path: Path, flags: list[str], says: tuple[str, ...]
) -> None:
    run = _kvscope(tmp_path, "bench", "--fake", *flags, *SMALL[2:4])
    assert run.returncode == 1, run.stdout[-1000:]
    one_line(run.stderr, *says)


def test_goodput_refuses_a_key_given_twice(tmp_path: Path) -> None:
    run = _kvscope(
        tmp_path, "bench", "--fake", "--concurrency", "1,2", "--goodput", "ttft:100000",
        "TTFT:1", *SMALL,
    )  # fmt: skip
    assert run.returncode == 1
    one_line(run.stderr, "--goodput", "ttft", "twice", "100000", "1")


@pytest.mark.parametrize(
    "pair",
    [
        "a=http://127.0.0.1:{port},b=http://127.0.0.1:{port}",
        "a=http://127.0.0.1:{port},b=http://127.0.0.1:{port}/",
        "a=http://localhost:{port},b=http://127.0.0.1:{port}/v1",
    ],
)
def test_compare_urls_refuses_one_server_given_twice(tmp_path: Path, pair: str) -> None:
    port = _dead_port()
    run = _kvscope(
        tmp_path, "bench", "--turns", "2", "--sessions", "1", "--compare-urls",
        pair.format(port=port),
    )  # fmt: skip
    assert run.returncode == 1
    # Refused before any attach: no "No vLLM server answers" about the first URL.
    line = one_line(run.stderr, "--compare-urls", "one server", str(port))
    assert "answers" not in line


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--request-rate", "1e-300"], ("1e-300", "86,400 s")),
        (["--request-rate", "0.001", "--num-prompts", "100"], ("100 requests", "0.001")),
        (["--request-rate", "0.01", "--duration", "10"], ("0.01", "100 s", "--duration 10")),
    ],
)
def test_a_rate_that_would_not_send_within_the_run_is_refused(
    tmp_path: Path, flags: list[str], says: tuple[str, ...]
) -> None:
    # Before, the first of these waited forever with nothing said: the timeout fails it.
    run = _kvscope(tmp_path, "bench", "--fake", *flags, *SMALL, timeout=30)
    assert run.returncode == 1
    one_line(run.stderr, "--request-rate", *says)


# -- item 6: the right words ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "says", "not_says"),
    [
        (["--goodput", "ttft:nan"], ("'ttft:nan'", "not a number"), "negative"),
        (["--goodput", "tpot:-5"], ("'tpot:-5'", "cannot be negative"), "not a number"),
        (["--request-rate", "nan"], ("'nan' is not a number",), "positive"),
        (["--request-rate", "1,NaN"], ("'NaN' is not a number",), "positive"),
        (["--request-rate", "1", "--burstiness", "inf"], ("--arrival constant",), "positive"),
        (["--duration", "0"], ("--duration", "must be more than 0 s"), "between"),
        (["--duration", "-3"], ("--duration", "-3 s", "more than 0 s"), "between"),
        (["--duration", "100000"], ("--duration", "100,000 s", "86,400 s (a day)"), "between"),
    ],
)
def test_load_values_are_refused_in_the_right_words(
    tmp_path: Path, flags: list[str], says: tuple[str, ...], not_says: str
) -> None:
    load = [] if "--request-rate" in flags else ["--concurrency", "1,2"]
    run = _kvscope(tmp_path, "bench", "--fake", *load, *flags, *SMALL)
    assert run.returncode == 1
    line = one_line(run.stderr, *says)
    assert not_says not in line


@pytest.mark.parametrize(
    "flags",
    [
        ["--replica", "=http://127.0.0.1:{port}"],
        ["--replica", " =http://127.0.0.1:{port}", "--replica", "http://127.0.0.1:1"],
        ["--turns", "2", "--compare-urls", "=http://127.0.0.1:{port},b=http://127.0.0.1:1"],
    ],
)
def test_an_empty_name_before_equals_is_called_empty(tmp_path: Path, flags: list[str]) -> None:
    port = _dead_port()
    run = _kvscope(tmp_path, "bench", *(f.format(port=port) for f in flags))
    assert run.returncode == 1
    line = one_line(run.stderr, "name", "empty")
    assert "is not http" not in line


def _vllm_marker(tmp_path: Path) -> tuple[Path, Path]:
    """A `sitecustomize` that leaves a file, and stops the import, when anything of vLLM
    past its package (`vllm.*`) or torch is imported: whether a command imported vLLM is
    then a file. Looking the package up (find_spec("vllm")) imports none of it."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "vllm-was-imported"
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('vllm.'):\n"
        f"            open({str(marker)!r}, 'w').close()\n"
        "            raise ImportError(name + ' imported where a test forbids it')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Watch())\n"
    )
    return site, marker


@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["bench"], ["generate"], []])
def test_an_unknown_flag_is_refused_before_vllm_is_imported(
    tmp_path: Path, command: list[str]
) -> None:
    site, marker = _vllm_marker(tmp_path)
    run = _kvscope(tmp_path, *command, "--bogus", PYTHONPATH=str(site))
    assert run.returncode in (1, 2), run.stdout[-2000:]
    one_line(run.stderr, "Unknown flag: --bogus", "kvscope engine-help")
    assert not marker.exists(), "vLLM was imported before --bogus was refused"


@pytest.mark.parametrize("command", [["doctor"], ["bench"], ["generate"]])
def test_a_stray_word_is_refused_before_vllm_is_imported(
    tmp_path: Path, command: list[str]
) -> None:
    site, marker = _vllm_marker(tmp_path)
    run = _kvscope(tmp_path, *command, "hello", "--max-model-len", "64", PYTHONPATH=str(site))
    assert run.returncode == 1, run.stdout[-2000:]
    one_line(run.stderr, "Unknown flag: hello")
    assert not marker.exists(), "vLLM was imported before 'hello' was refused"


def test_a_real_vllm_flag_still_goes_to_vllm(tmp_path: Path) -> None:
    """The quick refusal judges only names no vLLM source has: a real flag, or an
    abbreviation of one, is left to vLLM's parser (here it is imported, and stopped)."""
    site, marker = _vllm_marker(tmp_path)
    run = _kvscope(tmp_path, "doctor", "--max-model", "64", PYTHONPATH=str(site))
    assert "Unknown flag" not in run.stderr + run.stdout
    assert marker.exists()


def test_doctor_with_a_missing_home_does_not_create_it(tmp_path: Path) -> None:
    home = tmp_path / "nonexistent"
    env = {**os.environ, "HOME": str(home)}
    for name in ("KVSCOPE_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "KVSCOPE_DEBUG"):
        env.pop(name, None)
    run = run_kvscope("doctor", env=env, timeout=120)
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))
    assert "Traceback" not in run.stderr
    assert f"HOME ({home}) does not exist" in run.stdout + run.stderr
    # Not "ready": the embedded model is converted into that cache on first use.
    assert "advice: set HOME to a folder that exists" in run.stdout


def test_replicas_refuse_one_server_under_two_names(tmp_path: Path) -> None:
    port = _dead_port()
    run = _kvscope(
        tmp_path, "bench", "--replica", f"http://localhost:{port}",
        "--replica", f"http://127.0.0.1:{port}/", "--concurrency", "1,2",
    )  # fmt: skip
    assert run.returncode == 1
    line = one_line(run.stderr, "--replica", "one server", str(port))
    assert "answers" not in line


@pytest.mark.parametrize("where", ["dead", "models"])
def test_router_metrics_that_are_not_a_metrics_page_are_refused_before_the_run(
    tmp_path: Path, where: str
) -> None:
    from hostile_server import HostileServer

    with HostileServer("fail_after", 1000) as router, HostileServer("fail_after", 1000) as b:
        metrics = {
            "dead": f"http://127.0.0.1:{_dead_port()}/metrics",
            "models": f"{router.url}/v1/models",
        }[where]
        run = _kvscope(
            tmp_path, "bench", "--url", router.url, "--replica", f"b={b.url}",
            "--router-metrics", metrics, "--concurrency", "1,2", "--num-prompts", "2",
            "--prompt-lens", "16", "--output-len", "2", "--warmup", "0",
        )  # fmt: skip
        sent = router.served + b.served
    assert run.returncode == 1, run.stdout[-2000:]
    says = {"dead": "connection refused", "models": "not a Prometheus metrics page"}[where]
    one_line(run.stderr, "--router-metrics", metrics, says)
    assert sent == 0  # refused before the first request


def test_a_dead_replica_is_named_not_the_router_that_answered(tmp_path: Path) -> None:
    from hostile_server import HostileServer

    dead = f"http://127.0.0.1:{_dead_port()}"
    with HostileServer("fail_after", 1000) as router:
        run = _kvscope(
            tmp_path, "bench", "--url", router.url, "--replica", f"a={dead}",
            "--concurrency", "1,2", "--num-prompts", "2", "--prompt-lens", "16",
            "--output-len", "2", "--warmup", "0",
        )  # fmt: skip
    assert run.returncode == 1
    line = one_line(run.stderr, f"No vLLM server answers at {dead}", "replica a")
    assert "redirect" not in line  # nothing redirected: kvscope asked the replica itself
    assert f"the router at {router.url} answered" in line


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["bench", "--fake", "--prompt-lens", "16", "--output-len", "2"], ["--api-key", "k"]),
        (["bench", "--fake", "--prompt-lens", "16"], ["--tokenizer", "gpt2"]),
        (["bench", "--fake", "--prompt-lens", "16"], ["--timeout", "5"]),
        (["bench", "--fake", "--prompt-lens", "16"], ["--kv-events", "off"]),
        (["generate", "--prompt", "hi"], ["--served-model-name", "m"]),
        (["--fake", "--screenshot", "{tmp}/x.svg"], ["--router-metrics", "http://127.0.0.1:1"]),
    ],
)
def test_attach_flags_without_a_server_are_refused(
    tmp_path: Path, command: list[str], flag: list[str]
) -> None:
    site, marker = _vllm_marker(tmp_path)
    words = [w.format(tmp=tmp_path) for w in command]
    run = _kvscope(tmp_path, *words, *flag, PYTHONPATH=str(site))
    assert run.returncode == 1, run.stdout[-1000:]
    one_line(run.stderr, flag[0], "give --url URL")
    assert not marker.exists()  # said before vLLM is imported
