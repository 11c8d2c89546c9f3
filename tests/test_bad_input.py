"""The bad-input matrix, headless: every input a hostile user tried, and every fault.

Each case runs the real `kvscope` command in its own session and checks:
- the exit code;
- one `kvscope: ...` line on stderr, with the numbers that explain it;
- no "Traceback" and no "terminate called" (the C++ abort that exit 134 means);
- no process left in its process group;
- where something was written (bench results, the model folder), that nothing was lost.

Most cases are refused before vLLM is even imported. Those that need an engine start one
short-lived subprocess each, with a small context and KV pool, and are marked `engine`.
The TUI's rows (empty Enter, a long paste, fast Enters, the slider at M) are pilot tests
beside the app's other tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_helpers import (
    READY,
    command_env,
    finish_in_group,
    one_line,
    run_kvscope,
    start_kvscope,
)
from session_engine import TEST_DTYPE

from bench.sweep_result import SweepConfig, SweepResult
from engine import model_prep
from engine.fake import FakeConfig, FakeEngine
from engine.nvml import nvidia_gpu_count

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from engine.protocol import Engine

# Small enough to start fast: 1,024 tokens of context, 32 MiB of KV (10 blocks of 128).
SMALL = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(32 * 1024**2)]


# -- running kvscope ---------------------------------------------------------------------------
def _env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    env = command_env(**extra)
    if cache is not None:
        env["KVSCOPE_CACHE_DIR"] = str(cache)
    return env


def kvscope(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    prefix: Sequence[str] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`kvscope ARGS` in its own process group (cli_helpers.run_kvscope), in `_env()`
    unless told otherwise."""
    return run_kvscope(*args, env=env or _env(), timeout=timeout, stdin=stdin, prefix=prefix)


def clean(out: subprocess.CompletedProcess[str], code: int) -> list[str]:
    """The exit code, no traceback, no C++ abort; returns stderr's lines but the ready one."""
    assert out.returncode == code, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "terminate called" not in out.stderr, out.stderr[-3000:]
    return [x for x in out.stderr.splitlines() if x.strip() and not x.startswith(READY)]


def exited(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The stderr of a run that must have exited with `code` (for `one_line`)."""
    assert out.returncode == code, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    return out.stderr


@pytest.fixture(scope="session")
def without_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which importing vLLM fails loudly: a case run in it proves it
    was answered before vLLM (seconds of import) was even loaded."""
    poison = tmp_path_factory.mktemp("no-vllm")
    (poison / "vllm").mkdir()
    (poison / "vllm" / "__init__.py").write_text(
        'raise ImportError("kvscope imported vLLM before refusing the input")\n'
    )
    return _env(PYTHONPATH=str(poison))


# -- a private cache per test, holding the ready model -----------------------------------------
@pytest.fixture(scope="session")
def ready_model() -> Path:
    return model_prep.prepare_embedded_model()


@pytest.fixture
def cache(tmp_path: Path, ready_model: Path) -> Path:
    """A cache folder of this test's own (its engine.log is this test's), whose models
    folder is the real one, so no test converts the model again."""
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "models").symlink_to(ready_model.parent, target_is_directory=True)
    return folder


# -- flags refused before anything starts ------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "code", "numbers"),
    [
        (["--prompt-tokens", "0"], 1, ["--prompt-tokens", "0 is not a positive length"]),
        (["--prompt-tokens", "-5"], 1, ["--prompt-tokens", "-5 is not a positive length"]),
        # M and M+1: vLLM refuses a prompt of max_model_len tokens, not only longer ones.
        (["--prompt-tokens", "1024", *SMALL], 1, ["1,024 tokens", "1,024", "at most 1,023"]),
        (["--prompt-tokens", "1025", *SMALL], 1, ["1,025 tokens", "at most 1,023", "2 over"]),
        # 10^9 synthetic tokens would be GBs of prompt: refused before any is built.
        (["--prompt-tokens", str(10**9), *SMALL], 1, ["1,000,000,000 tokens", "1,024"]),
        (["--max-tokens", "0"], 1, ["--max-tokens", "0 is not a positive count"]),
        (["--max-tokens", "-1"], 1, ["--max-tokens", "-1 is not a positive count"]),
        (["--max-tokens", str(10**7), *SMALL], 1, ["--max-tokens", "10,000,000", "1,024"]),
        (["--temperature", "-1"], 1, ["--temperature", "-1.0"]),
        (["--temperature", "nan"], 1, ["--temperature", "nan"]),
        (["--temperature", "inf"], 1, ["--temperature", "inf"]),
        (["--prompt", ""], 1, ["--prompt", "empty"]),
        (["--prompt", "   "], 1, ["--prompt", "empty"]),
        (["--prompt-file", "/no/such/prompt.txt"], 1, ["/no/such/prompt.txt", "No such file"]),
        (["--prompt-tokens", "many"], 2, ["--prompt-tokens", "'many'"]),
        (["--prompt", "hi", "--prompt-tokens", "8"], 2, ["--prompt-tokens", "--prompt"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_generate_refuses_bad_flags_at_once(
    flags: list[str], code: int, numbers: list[str], without_vllm: dict[str, str]
) -> None:
    # No vLLM import, no engine: these answer in well under a second.
    one_line(exited(kvscope("generate", *flags, env=without_vllm, timeout=60), code), *numbers)


def test_an_empty_prompt_file_and_empty_stdin_are_refused(
    tmp_path: Path, without_vllm: dict[str, str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\n")
    out = kvscope("generate", "--prompt-file", str(empty), env=without_vllm, timeout=60)
    one_line(exited(out, 1), str(empty), "holds no text")
    out = kvscope("generate", "--prompt-file", "-", stdin=b"", env=without_vllm, timeout=60)
    one_line(exited(out, 1), "stdin holds no text")


# -- refused once vLLM has read the flags or the model: one interpreter for them all --------
# Each of these costs a vLLM import and no engine that serves; tests/cli_batch.py runs them
# one after another in one process (one import, each with its own environment, engine log
# and stdout/stderr), which saves about 10 s of CPU a case on a slow CPU.
STARTUP_FAILURES = {
    # 8,192 tokens x 23,040 bytes (SmolLM2 in bf16) = 188,743,680 bytes; 64 MiB holds
    # about 2,900 tokens of KV, and vLLM rounds that to whole blocks.
    "pool too small": ["--max-model-len", "8192", "--kv-cache-memory-bytes", str(64 * 1024**2)],
    "pool of 1 byte": ["--kv-cache-memory-bytes", "1"],
    "max-model-len 10^7": ["--max-model-len", "10000000"],
    "block size 17": ["--block-size", "17", *SMALL],
}
CORRUPT = "corrupt model folder"
REFUSALS: dict[str, list[str]] = {
    # "1k" is vLLM's own spelling of 1,000: only its parser knows it, before the engine.
    "limit spelled for vLLM": ["generate", "--prompt-tokens", "1000", "--max-model-len", "1k"],
    # Only vLLM's parser knows every engine flag: this one costs a vLLM import, no more.
    "unknown flag": ["generate", "--prompt", "hi", "--bogus-flag"],
    **{
        name: ["generate", "--prompt-tokens", "8", "--max-tokens", "2", *flags]
        for name, flags in STARTUP_FAILURES.items()
    },
}


@dataclass(frozen=True)
class Refusal:
    """One command of the batch: how it ended, and the cache folder it ran in."""

    out: subprocess.CompletedProcess[str]
    cache: Path


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory, ready_model: Path) -> dict[str, Refusal]:
    root = tmp_path_factory.mktemp("refusals")
    corrupt = root / "corrupt-model"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    commands = {**REFUSALS, CORRUPT: ["generate", "--prompt", "hi", "--model", str(corrupt)]}
    caches: dict[str, Path] = {}
    cases = []
    for i, (name, argv) in enumerate(commands.items()):
        caches[name] = root / f"cache-{i}"
        caches[name].mkdir()
        (caches[name] / "models").symlink_to(ready_model.parent, target_is_directory=True)
        cases.append({"argv": argv, "env": _env(caches[name])})
    (root / "cases.json").write_text(json.dumps(cases))
    batch = Path(__file__).with_name("cli_batch.py")
    ran = subprocess.run(
        [sys.executable, str(batch), str(root / "cases.json"), str(root / "results.json")],
        env=_env(), capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert ran.returncode == 0, f"the batch itself failed: {ran.stderr[-3000:]}"
    results = json.loads((root / "results.json").read_text())
    return {
        name: Refusal(
            subprocess.CompletedProcess(argv, r["code"], r["stdout"], r["stderr"]), caches[name]
        )
        for (name, argv), r in zip(commands.items(), results, strict=True)
    }


@pytest.mark.own_engine
@pytest.mark.xdist_group("refusals")  # the batch runs once, in one worker
def test_a_limit_spelled_for_vllm_is_checked_once_vllm_has_read_it(
    refusals: dict[str, Refusal],
) -> None:
    out = refusals["limit spelled for vLLM"].out
    one_line(exited(out, 1), "1,000 tokens", "at most 999")


@pytest.mark.own_engine
@pytest.mark.xdist_group("refusals")
def test_an_unknown_flag_is_refused_before_the_engine_starts(
    refusals: dict[str, Refusal],
) -> None:
    out = refusals["unknown flag"].out
    one_line(exited(out, 1), "Unknown flag: --bogus-flag", "kvscope engine-help")


def test_a_missing_or_empty_model_folder_is_refused_at_once(
    tmp_path: Path, without_vllm: dict[str, str]
) -> None:
    missing = ["--prompt", "hi", "--model", "./no/such/model"]
    out = kvscope("generate", *missing, env=without_vllm, timeout=60)
    one_line(exited(out, 1), "Model not found", "'./no/such/model'", "no such file or folder")
    empty = ["--prompt", "hi", "--model", str(tmp_path)]
    out = kvscope("generate", *empty, env=without_vllm, timeout=60)
    one_line(exited(out, 1), "Model not found", str(tmp_path), "no config.json")


@pytest.mark.parametrize(
    ("flags", "code", "numbers"),
    [
        (["--prompt-lens", ""], 1, ["--prompt-lens"]),
        (["--prompt-lens", "512,,1024"], 1, ["--prompt-lens", "512,,1024"]),
        (["--prompt-lens", "abc"], 1, ["--prompt-lens", "'abc'"]),
        (["--prompt-lens", "0"], 1, ["--prompt-lens", "0"]),
        (["--prompt-lens", "512,-4"], 1, ["--prompt-lens", "-4"]),
        (["--runs", "many"], 1, ["--runs", "'many'"]),
        (["--output-len", str(10**7), *SMALL], 1, ["--output-len", "10,000,000", "1,024"]),
        (["--json", "/no/such/folder/out.json"], 1, ["--json", "/no/such/folder", "not exist"]),
        (["--json", "/proc/kvscope-out.json"], 1, ["--json", "cannot write in /proc"]),
        (["--csv", "/tmp"], 1, ["--csv", "/tmp is a folder"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_bench_refuses_junk_and_unwritable_outputs_before_the_engine(
    flags: list[str], code: int, numbers: list[str], without_vllm: dict[str, str]
) -> None:
    one_line(exited(kvscope("bench", *flags, env=without_vllm, timeout=60), code), *numbers)


# -- bench never loses a finished point --------------------------------------------------------
def test_bench_writes_each_point_as_it_lands_and_survives_a_lost_folder(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from cli.bench import report
    from cli.measure import measure
    from cli.result_files import ResultFile

    out = tmp_path / "out"
    out.mkdir()
    json_file = ResultFile("--json", str(out / "r.json"), SweepResult.to_json)
    csv_file = ResultFile("--csv", str(out / "r.csv"), SweepResult.to_csv)
    for f in (json_file, csv_file):
        f.check()
    seen: list[tuple[int, bool]] = []
    original = ResultFile.write

    def watch(self: ResultFile, result: SweepResult) -> None:
        original(self, result)
        if self is json_file and self.written_to == json_file.path:
            on_disk = json.loads(json_file.path.read_text())
            seen.append((len(on_disk["points"]), on_disk["complete"]))
            if len(on_disk["points"]) == 2:
                # The folder goes away mid-sweep (a full disk acts the same way).
                shutil.rmtree(out)

    config = SweepConfig(prompt_lens=(32, 64, 5000, 96), output_len=4, runs=1, warmup=0)
    result = SweepResult(config, complete=False)
    engine = FakeEngine(FakeConfig(max_model_len=1024, total_blocks=256))
    engine.start()
    try:
        ResultFile.write = watch  # type: ignore[method-assign]
        measure(engine, config, result, [json_file, csv_file], hardware=None)
    finally:
        ResultFile.write = original  # type: ignore[method-assign]
    # The file grew one point at a time, marked partial until the end.
    assert seen == [(1, False), (2, False)]
    code = report(result, [json_file, csv_file])
    assert code == 3  # the 5,000-token point failed: past the 1,024 wall
    printed = capfd.readouterr()
    assert "kvscope bench" in printed.out  # the table printed anyway
    for f in (json_file, csv_file):
        assert f.written_to is not None
        assert f.written_to != f.path
        assert f"could not write {f.path}" in printed.err
        assert f"the results are in {f.written_to}" in printed.err
    saved = SweepResult.from_json(json_file.written_to.read_text())  # type: ignore[union-attr]
    assert saved.complete
    assert [p.prompt_len for p in saved.points] == [32, 64, 5000, 96]
    assert [p.ok for p in saved.points] == [True, True, False, True]
    rows = SweepResult.rows_from_csv(csv_file.written_to.read_text())  # type: ignore[union-attr]
    assert [r["prompt_len"] for r in rows] == [32, 64, 5000, 96]
    for f in (json_file, csv_file):
        f.written_to.unlink()  # type: ignore[union-attr]


def test_a_sweep_never_builds_a_prompt_past_the_wall() -> None:
    from bench.sweep import run_sweep

    engine = FakeEngine(FakeConfig(max_model_len=1024, total_blocks=256))
    engine.start()
    built: list[int] = []
    real = engine.synthetic_prompt

    def counting(num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        built.append(num_tokens)
        assert num_tokens < 10**6, f"a prompt of {num_tokens:,} tokens was built"
        return real(num_tokens, suffix, seed)

    engine.synthetic_prompt = counting  # type: ignore[method-assign]
    config = SweepConfig(prompt_lens=(1024, 10**9, 1023), output_len=2, runs=1, warmup=1)
    result = asyncio.run(run_sweep(engine, config))
    assert [p.ok for p in result.points] == [False, False, True]
    assert "1,000,000,000 tokens" in (result.points[1].error or "")
    # The warm-up stays under the wall (1,023), and nothing at or past it was built.
    assert built == [1023, 1023]


# -- the model folder and the cache ------------------------------------------------------------
def test_a_killed_conversion_is_swept_and_a_live_one_is_not(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(cache))
    models = model_prep.embedded_model_dir().parent
    stale = models / f"{model_prep.TEMP_PREFIX}k1ll3d"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half written")
    try:
        # A conversion running elsewhere holds the lock: its folder must stay.
        import fcntl

        fd = os.open(models / model_prep.LOCK_FILE, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            assert model_prep.sweep_stale_temps(models) == []
            assert stale.is_dir()
        finally:
            os.close(fd)
        path = model_prep.prepare_embedded_model()
        assert not stale.exists()
        assert model_prep.verify_model_dir(path) == []
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the weights are 260 MB: share them where the disk allows
    except OSError:
        shutil.copy2(src, dst)


@pytest.fixture
def read_only_cache(tmp_path: Path, ready_model: Path) -> Iterator[tuple[Path, list[str]]]:
    """A cache folder holding a ready model, and the command prefix that makes it
    read-only for kvscope: a read-only bind mount in a private mount namespace as root
    (whom permission bits do not stop), plain permission bits otherwise."""
    folder = tmp_path / "ro-cache"
    shutil.copytree(ready_model, folder / "models" / ready_model.name, copy_function=_link_or_copy)
    if os.geteuid() != 0:
        dirs = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
        for d in dirs:
            d.chmod(0o555)
        yield folder, []
        for d in dirs:
            d.chmod(0o755)
        return
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"]).returncode != 0:
        pytest.skip("root without a private mount namespace: no folder can be made read-only")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    yield folder, [unshare, "-m", "sh", "-c", script, str(folder)]


def test_a_read_only_cache_without_the_model_says_which_folder(
    read_only_cache: tuple[Path, list[str]],
) -> None:
    folder, prefix = read_only_cache
    models = folder / "models"
    shutil.rmtree(models / model_prep.EMBEDDED_MODEL_NAME)
    out = kvscope("prepare-model", env=_env(folder), prefix=prefix, timeout=120)
    one_line(
        exited(out, 1), f"Cannot write to kvscope's cache folder {models}", "KVSCOPE_CACHE_DIR"
    )


def test_a_read_only_cache_with_a_ready_model_is_used_as_is(
    read_only_cache: tuple[Path, list[str]],
) -> None:
    folder, prefix = read_only_cache
    out = kvscope("prepare-model", env=_env(folder), prefix=prefix, timeout=120)
    assert clean(out, 0) == []
    assert out.stdout.strip() == str(folder / "models" / model_prep.EMBEDDED_MODEL_NAME)


@pytest.mark.own_engine
def test_generate_with_a_read_only_cache_logs_elsewhere_and_says_so(
    read_only_cache: tuple[Path, list[str]],
) -> None:
    folder, prefix = read_only_cache
    # M-1 as well: the longest prompt vLLM takes at this context, with room for one token
    # (a context of 256, so that the prefill takes seconds on a slow CPU, not tens).
    out = kvscope(
        "generate", "--prompt-tokens", "255", "--max-tokens", "1", "--json", *SMALL,
        "--max-model-len", "256", env=_env(folder), prefix=prefix,
    )  # fmt: skip
    line = one_line(exited(out, 0), "cannot write vLLM's log", str(folder / "engine.log"))
    assert "goes to" in line or "not kept" in line
    data = json.loads(out.stdout)
    assert (data["prompt_tokens"], data["output_tokens"]) == (255, 1)


# -- start-up failures keep their numbers ------------------------------------------------------
@pytest.mark.own_engine
@pytest.mark.xdist_group("refusals")
@pytest.mark.parametrize(
    ("name", "numbers", "fits"),
    [
        (
            "pool too small",
            ["KV pool too small", "8,192 tokens", "188,743,680 bytes", "67,108,864 bytes"],
            (2000, 64 * 1024**2 // 23040),
        ),
        (
            "pool of 1 byte",
            ["KV pool too small", "8,192 tokens", "188,743,680 bytes", "only 1 byte"],
            None,
        ),
        (
            "max-model-len 10^7",
            ["--max-model-len", "10,000,000", "8,192", "max_position_embeddings"],
            None,
        ),
        pytest.param(
            "block size 17",
            ["--block-size", "17", "(CPU_ATTN: [MultipleOf(32)])"],
            None,
            # The CPU backend's rule: on CUDA vLLM may pick another attention backend.
            marks=pytest.mark.skipif(nvidia_gpu_count() > 0, reason="the CPU backend's rule"),
        ),
    ],
    ids=list(STARTUP_FAILURES),
)
def test_start_up_failures_say_why_with_numbers(
    refusals: dict[str, Refusal], name: str, numbers: list[str], fits: tuple[int, int] | None
) -> None:
    refusal = refusals[name]
    line = one_line(exited(refusal.out, 1), *numbers)
    if fits is not None:
        # The length that would fit, estimated from vLLM's pool (one start-up covers what
        # a test of the typed error in its own process checked: the same figures).
        said = re.search(r"At most about ([\d,]+) tokens would fit", line)
        assert said is not None, line
        assert fits[0] < int(said[1].replace(",", "")) <= fits[1], line
    # The whole of vLLM's text, traceback and all, is in this command's own engine log.
    log = (refusal.cache / "engine.log").read_text()
    assert "kvscope: the engine failed to start" in log
    assert "Traceback" in log


@pytest.mark.own_engine
@pytest.mark.xdist_group("refusals")
def test_a_corrupt_model_folder_is_one_line(refusals: dict[str, Refusal]) -> None:
    out = refusals[CORRUPT].out
    folder = Path(out.args[-1])
    one_line(exited(out, 1), "could not start", str(folder / "config.json"), "not a valid JSON")


@pytest.mark.own_engine
def test_a_prompt_that_is_not_utf8_is_decoded_and_said(cache: Path) -> None:
    # Latin-1 "café" and a stray byte: what a file from another system gives the shell.
    prompt = os.fsdecode(b"caf\xe9 au lait \xff please")
    out = kvscope(
        "generate", "--prompt", prompt, "--max-tokens", "8", "--ignore-eos", "--json", *SMALL,
        env=_env(cache),
    )  # fmt: skip
    one_line(exited(out, 0), "--prompt is not valid UTF-8", "2 bytes replaced")
    # The same run's JSON, whole: one engine start checks both (a synthetic prompt's exact
    # length is checked by the read-only cache's run above).
    data = json.loads(out.stdout)
    for key in ("ttft_s", "itl_s", "output_tokens", "prompt_tokens", "model", "steps", "text"):
        assert key in data
    assert data["prompt_tokens"] > 5
    assert data["output_tokens"] == 8
    assert len(data["itl_s"]) == 7
    assert data["model"]["kv_bytes_per_token"] == 23040
    assert data["model"]["max_model_len"] == 1024
    assert sum(s["decode_tokens"] for s in data["steps"]) == 7
    assert data["steps"][0]["prefill_tokens"] == data["prompt_tokens"]
    assert len(data["steps"]) == 8


@pytest.mark.own_engine
def test_bench_with_a_huge_length_measures_the_rest_and_keeps_every_point(
    cache: Path, tmp_path: Path
) -> None:
    # A length past the wall, and one past it by a billion, between two that fit: one
    # engine start shows that each failed alone and that the lengths after still ran.
    lens = [64, 3000, 128, 10**9]
    json_path, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    out = kvscope(
        "bench", "--prompt-lens", ",".join(map(str, lens)), "--output-len", "4", "--runs", "1",
        "--warmup", "0", "--no-roofline", "--json", str(json_path), "--csv", str(csv_path),
        *SMALL, env=_env(cache),
    )  # fmt: skip
    one_line(
        exited(out, 3),
        "2 of 4 lengths failed: 3000: Prompt too long: 3,000 tokens",
        "1,000,000,000 tokens",
        "1,024",
    )
    assert "kvscope bench" in out.stdout  # the table
    assert "TTFT" in out.stdout
    assert "median ITL" in out.stdout
    data = json.loads(json_path.read_text())
    assert data["complete"] is True
    assert [(p["prompt_len"], p["ok"]) for p in data["points"]] == [
        (64, True),
        (3000, False),
        (128, True),
        (10**9, False),
    ]
    assert [r["prompt_len"] for r in SweepResult.rows_from_csv(csv_path.read_text())] == lens


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------
class Running:
    """`kvscope generate` in its own session, watched while it runs."""

    def __init__(self, cache_folder: Path, *flags: str) -> None:
        self.log = cache_folder / "engine.log"
        self.stderr = b""
        self.proc = start_kvscope("generate", *flags, env=_env(cache_folder))

    def wait_for_log(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.is_file() and text in self.log.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, "kvscope ended before: " + self._drain()
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never reached the engine log")

    def wait_for_stderr(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while text.encode() not in self.stderr:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never came: {self.stderr.decode(errors='replace')}"
            ready, _, _ = select.select([self.proc.stderr], [], [], left)
            chunk = os.read(self.proc.stderr.fileno(), 4096) if ready else b""
            assert chunk or not ready, "kvscope ended before: " + self._drain()
            self.stderr += chunk

    def wait_for_stdout(self) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        assert ready and os.read(self.proc.stdout.fileno(), 64), "no token came"

    def signal(self, sig: int) -> float:
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def finish(self) -> subprocess.CompletedProcess[str]:
        out, err = finish_in_group(self.proc, 180)
        return subprocess.CompletedProcess(
            ["kvscope", "generate"],
            self.proc.wait(),
            out.decode(errors="replace"),
            (self.stderr + err).decode(errors="replace"),
        )

    def _drain(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate()
        return (self.stderr + err).decode(errors="replace")[-3000:]


STOPPING = "kvscope: stopping the engine… (Ctrl-C again to force)"
# A prefill in one engine step, inside native code, of about PREFILL_S seconds at the rate
# measured here: a 512-token prefill is 5.8 s on a 2-core AVX2 CPU and 14 times faster on
# an AMX one, so the length is the rate's, up to PREFILL_MAX_TOKENS (the most the session
# engine measures; 4,000 tokens are about 3 s on the fast CPU, where 2,000 left it 1.6 s and
# the signals and the exit a second of it).
PREFILL_S = 4.0
PREFILL_MAX_TOKENS = 4000


@dataclass(frozen=True)
class LongPrefill:
    """`kvscope generate` flags for one long prefill, and how long that prefill took on
    the session's engine just now: the tests size their waits and bounds on it."""

    flags: list[str]
    tokens: int
    prefill_s: float


@pytest.fixture(scope="module")
def long_prefill(vllm_engine: Engine) -> LongPrefill:
    """A prompt whose prefill takes about PREFILL_S seconds on this machine (at most 2,000
    tokens), and its TTFT measured at that very length.

    Each figure is the best of two: another process's burst of work (the other xdist
    worker's engine, say) once made a 256-token prefill take 25 times its idle time here,
    and a prompt sized on that, and waits sized on it, fit no later run."""
    from engine.events import GenerationRequest, RequestFinished, SamplingSettings

    async def ttft(n: int, seed: int) -> float:
        request = GenerationRequest(
            f"rate-{n}-{seed}",
            prompt_token_ids=vllm_engine.synthetic_prompt(n, seed=9100 + 7 * n + seed),
            sampling=SamplingSettings(max_tokens=1, ignore_eos=True),
        )
        async for event in vllm_engine.stream(request):
            if isinstance(event, RequestFinished) and event.ttft_s is not None:
                return event.ttft_s
        raise AssertionError("no first token")

    def best(n: int) -> float:  # fresh seeds: no prefix-cache hit
        return min(asyncio.run(ttft(n, seed)) for seed in (1, 2))

    rate = 256 / best(256)
    tokens = max(256, min(PREFILL_MAX_TOKENS, int(rate * PREFILL_S)))
    # In the session engine's dtype: the rate measured there is the subprocess's rate. The
    # whole prompt in one step (vLLM's CPU default budget is 2,048 or 4,096 tokens by how it
    # is started): a first Ctrl-C waits for that one step, not for the first chunk of it.
    flags = [
        "--prompt-tokens", str(tokens), "--max-tokens", "4", "--json", "--dtype", TEST_DTYPE,
        "--max-model-len", "4096", "--max-num-batched-tokens", "4096",
        "--kv-cache-memory-bytes", str(256 * 1024**2),  # 4,096 float32 tokens: 189 MB
    ]  # fmt: skip
    prefill = LongPrefill(flags, tokens, best(tokens))
    print(f"\nlong prefill: {tokens} tokens in {prefill.prefill_s:.2f} s")
    return prefill


LONG_DECODE = ["--prompt", "Count to a thousand.", "--max-tokens", "900", "--ignore-eos", *SMALL]


@pytest.mark.engine
def test_ctrl_c_while_loading_waits_for_the_engine_thread(cache: Path) -> None:
    run = Running(cache, "--prompt-tokens", "8", "--max-tokens", "2", *SMALL)
    # The step thread is building the engine, inside torch and vLLM's native code.
    run.wait_for_log("Starting to load model")
    run.signal(signal.SIGINT)
    out = run.finish()
    assert clean(out, 130) == [STOPPING]
    # The build ran to its end before the interpreter left: the thread was waited for.
    assert "init engine (profile, create kv cache" in run.log.read_text()


@pytest.mark.engine
def test_ctrl_c_mid_prefill_stops_cleanly(cache: Path, long_prefill: LongPrefill) -> None:
    run = Running(cache, *long_prefill.flags)
    run.wait_for_stderr(READY)
    # A quarter into the prefill, as measured here: the prompt is built and the step has
    # begun (nothing outside the step says so), and three quarters of it are still to run.
    time.sleep(long_prefill.prefill_s / 4)
    run.signal(signal.SIGINT)
    out = run.finish()
    assert clean(out, 130) == [STOPPING]
    assert out.stdout == ""


@pytest.mark.engine
def test_a_second_ctrl_c_leaves_at_once(cache: Path, long_prefill: LongPrefill) -> None:
    run = Running(cache, *long_prefill.flags)
    run.wait_for_stderr(READY)
    ready = time.monotonic()
    time.sleep(long_prefill.prefill_s / 4)
    run.signal(signal.SIGINT)
    run.wait_for_stderr(STOPPING)  # the first one was taken: the second is a second
    second = run.signal(signal.SIGINT)
    out = run.finish()
    gone = time.monotonic()
    # It did not wait for the prefill step to end: the step began after the engine was
    # ready and takes prefill_s (measured on this machine, at this length), so a process
    # that waited for it could not be gone before ready + prefill_s.
    assert gone < ready + long_prefill.prefill_s, (
        f"gone {gone - second:.2f} s after the second Ctrl-C, {gone - ready:.2f} s after "
        f"ready; a prefill of {long_prefill.tokens} tokens takes {long_prefill.prefill_s:.2f} s"
    )
    assert clean(out, 130) == [STOPPING, "kvscope: forced exit"]


@pytest.mark.own_engine
def test_ctrl_c_mid_decode_stops_cleanly(cache: Path) -> None:
    run = Running(cache, *LONG_DECODE)
    run.wait_for_stdout()  # tokens are streaming
    run.signal(signal.SIGINT)
    out = run.finish()
    assert clean(out, 130) == [STOPPING]


@pytest.mark.own_engine
def test_sigterm_mid_decode_stops_cleanly(cache: Path) -> None:
    run = Running(cache, *LONG_DECODE)
    run.wait_for_stdout()
    run.signal(signal.SIGTERM)
    out = run.finish()
    assert clean(out, 143) == ["kvscope: terminated; stopping the engine… (send it again to force)"]


# -- the pieces, without a process ------------------------------------------------------------
def test_prompt_bytes_that_are_not_utf8_become_u_fffd_and_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse
    import io

    from cli.generate import decode_prompt, read_inputs

    assert decode_prompt("naïve".encode(), "--prompt") == ("naïve", None)
    text, notice = decode_prompt(b"caf\xe9 \xff\xfe!", "--prompt-file")
    assert text == "caf\ufffd \ufffd\ufffd!"
    assert notice == "--prompt-file is not valid UTF-8: 3 bytes replaced by U+FFFD"
    stdin = io.TextIOWrapper(io.BytesIO(b"r\xe9sum\xe9 please"))
    monkeypatch.setattr(sys, "stdin", stdin)
    args = argparse.Namespace(
        prompt=None,
        prompt_file="-",
        prompt_tokens=None,
        max_tokens=8,
        temperature=0.0,
        ignore_eos=False,
    )
    inputs = read_inputs(args)
    assert inputs.prompt == "r\ufffdsum\ufffd please"
    assert inputs.notices == ("--prompt-file is not valid UTF-8: 2 bytes replaced by U+FFFD",)


def test_start_errors_resolve_the_numbers_vllm_leaves_out(ready_model: Path) -> None:
    from engine.errors import BadOption, EngineStartFailed, KvPoolTooSmall
    from engine.vllm.startup import map_start_error

    def mapped(exc: BaseException, **given: int | None) -> object:
        kw: dict[str, Any] = {
            "max_model_len": None,
            "kv_bytes_per_token": None,
            "block_size": None,
            "kv_cache_memory_bytes": None,
        }
        return map_start_error(exc, model=str(ready_model), **{**kw, **given})

    # vLLM's words for a pool under one block carry no numbers at all.
    pool = mapped(
        ValueError("No available memory for the cache blocks. Try increasing ..."),
        kv_cache_memory_bytes=1,
    )
    assert isinstance(pool, KvPoolTooSmall)
    # 8,192 tokens (the model's own context) x 23,040 bytes (SmolLM2's KV per token).
    assert (pool.needed_bytes, pool.available_bytes, pool.max_model_len) == (
        8192 * 23040,
        1,
        8192,
    )
    assert "188,743,680 bytes" in pool.plain()
    assert "only 1 byte is" in pool.plain()
    wrapped = ValueError(
        "1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (10000000) is greater than the derived "
        "max_model_len (max_position_embeddings=8192.0 or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, input_value=ArgsKwargs((), {})]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
    )
    too_long = mapped(wrapped)
    assert isinstance(too_long, BadOption)
    assert too_long.option == "--max-model-len"
    assert "10,000,000" in too_long.plain()
    assert "8,192" in too_long.plain()
    # Any other wrapped reason keeps its lines that say why, not the wrapper.
    other = mapped(ValueError("1 validation error for CacheConfig\n  Value error, bad block"))
    assert isinstance(other, EngineStartFailed)
    assert other.plain() == "The engine could not start: ValueError: bad block"
