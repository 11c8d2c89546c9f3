"""Private files on a shared box (issue 22): every file kvscope writes is 0600 and every
folder it makes is 0700, whatever the umask; the temp fallback of the engine log never
follows what another user planted there.

Each case runs under umask 022 (the usual default, which made tapes 0644 in 0755
folders), in this process, with the fake engine: no vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bench.sweep_result import SweepConfig, SweepPoint, SweepResult
from engine.clock import VirtualClock
from engine.fake import FakeEngine
from engine.paths import (
    UnsafeFolder,
    fallback_log_dir,
    open_fallback_log,
    private_dir,
    write_private,
)
from engine.tape import RecordingEngine, TapeRecorder, read_tape

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def fresh_engine_log() -> Iterator[logging.Logger]:
    """vLLM's logger with no kvscope route yet (another test may have made one), put
    back as it was afterwards; the handlers made meanwhile are closed."""
    log = logging.getLogger("vllm")
    warnings_log = logging.getLogger("py.warnings")
    saved = (log.handlers[:], log.level, log.propagate)
    saved_warnings = (warnings_log.handlers[:], warnings_log.propagate)
    log.handlers = []
    try:
        yield log
    finally:
        for handler in log.handlers:
            handler.close()
        log.handlers, level, log.propagate = saved
        log.setLevel(level)
        warnings_log.handlers, warnings_log.propagate = saved_warnings
        logging.captureWarnings(False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def _fake_session(engine: RecordingEngine) -> None:
    from engine.events import ChatMessage, GenerationRequest

    engine.record_user_message("a secret prompt", request_ids=["r1"])
    request = GenerationRequest("r1", messages=(ChatMessage("user", "a secret prompt"),))
    async for _ in engine.stream(request):
        pass


def _record(path: Path | None) -> Path:
    fake = FakeEngine(clock=VirtualClock())
    engine = RecordingEngine(fake, TapeRecorder(path, clock=fake.features.clock))
    engine.start()
    asyncio.run(_fake_session(engine))
    engine.shutdown()
    return engine.recorder.path


async def _screenshots(folder: Path) -> list[Path]:
    from tui_helpers import make_app

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        saved = Path(app.save_screenshot(filename="saved.svg", path=str(folder)))
        app.screenshot_folder = folder / "delivered"
        app.deliver_screenshot(filename="delivered.svg")
        delivered = folder / "delivered" / "delivered.svg"
        for _ in range(3000):  # Textual writes it from a thread (60 s: a hang guard)
            if delivered.is_file() and delivered.stat().st_size > 0:
                break
            await asyncio.sleep(0.02)
        assert delivered.is_file(), f"Textual's thread did not write {delivered} in 60 s"
    return [saved, delivered]


async def test_every_file_kvscope_writes_is_0600_in_0700_folders(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    umask_022: None,
    fresh_engine_log: logging.Logger,
) -> None:
    from cli.compare import Comparison, report_compare
    from cli.launch import route_logs
    from cli.result_files import ResultFile
    from tui.settings import AppSettings

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("KVSCOPE_TAPE_DIR", str(home / "data" / "kvscope" / "tapes"))
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(home / "cache" / "kvscope"))
    monkeypatch.setenv("KVSCOPE_CONFIG_DIR", str(home / "config" / "kvscope"))
    written: list[Path] = []

    # Tapes: the default folder, a folder the user named, and a file that was 0644.
    written.append(await asyncio.to_thread(_record, None))
    written.append(await asyncio.to_thread(_record, home / "mine" / "deep" / "t.jsonl"))
    old = home / "old.jsonl"
    old.write_text("")
    assert _mode(old) == 0o644
    written.append(await asyncio.to_thread(_record, old))
    assert "a secret prompt" in written[0].read_text()
    assert read_tape(written[1]).messages
    # Settings, and a broken settings file kept beside it.
    settings = AppSettings.load()
    written.append(settings.save())
    settings.path.write_text("[1]")
    settings.save(only=("theme",))
    written.append(settings.path.with_suffix(".json.bad"))
    # Screenshots: saved headless, and delivered from inside the app (Ctrl+S).
    shots = private_dir(home / "shots")
    written += await _screenshots(shots)
    # The engine log, through the same route as the CLI's.
    route_logs()
    fresh_engine_log.error("kvscope: a logged line")
    written.append(home / "cache" / "kvscope" / "engine.log")
    # Sweep results: bench's files, a compare file, the sweep screen's export.
    config = SweepConfig(prompt_lens=(64,), output_len=4, runs=1, warmup=0, concurrency=1)
    result = SweepResult(config, [SweepPoint(64, True, None, None)])
    for option, name, render in (
        ("--json", "r.json", SweepResult.to_json),
        ("--csv", "r.csv", SweepResult.to_csv),
    ):
        f = ResultFile(option, str(home / name), render)
        f.write(result)
        written.append(home / name)
    compare = home / "cmp.json"
    import argparse

    args = argparse.Namespace(compare=["", "--x"])
    report_compare(Comparison({"A": result, "B": result}, config), args, str(compare))
    written.append(compare)
    written.append(write_private(home / "export.json", result.to_json()))

    for path in written:
        assert path.is_file(), path
        assert _mode(path) == 0o600, (path, oct(_mode(path)))
    # Every file and folder under home is kvscope's (home itself is the test's).
    for folder, dirs, files in os.walk(home):
        for name in dirs:
            assert _mode(Path(folder) / name) == 0o700, Path(folder) / name
        for name in files:
            assert _mode(Path(folder) / name) == 0o600, Path(folder) / name
    assert {p.name for p in home.iterdir()} >= {"data", "mine", "cache", "config", "shots"}


# -- the temp fallback of the engine log -----------------------------------------------------


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir(mode=0o777)
    root.chmod(0o1777)  # as /tmp: everyone may create in it
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_the_temp_fallback_never_follows_a_planted_symlink(
    tmp_path: Path,
    temp_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    fresh_engine_log: logging.Logger,
) -> None:
    from cli.launch import route_logs

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "engine.log").write_text("the victim's own file\n")
    planted = fallback_log_dir()
    assert planted.parent == temp_root
    planted.symlink_to(victim)
    # The cache cannot take the log (a file where its folder should be).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(blocker / "cache"))

    route_logs()
    fresh_engine_log.error("kvscope: unexpected error", exc_info=ValueError("boom"))
    _, err = capfd.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kvscope: cannot write vLLM's log to {blocker / 'cache'}")
    assert f"{planted} is a symlink or not a folder, so it is not used" in lines[0]
    assert lines[0].endswith("it is not kept")
    assert (victim / "engine.log").read_text() == "the victim's own file\n"
    assert sorted(p.name for p in victim.iterdir()) == ["engine.log"]


def test_the_temp_fallback_is_used_only_if_private(tmp_path: Path, temp_root: Path) -> None:
    folder = fallback_log_dir()
    # Made by kvscope: 0700, and the log in it 0600, whatever the umask.
    old = os.umask(0o022)
    try:
        path, stream = open_fallback_log()
    finally:
        os.umask(old)
    stream.write("line\n")
    stream.close()
    assert path == folder / "engine.log"
    assert (_mode(folder), _mode(path)) == (0o700, 0o600)
    # A log in it that is a symlink to another file.
    path.unlink()
    other = tmp_path / "other.log"
    other.write_text("")
    path.symlink_to(other)
    with pytest.raises(OSError, match="symbolic links"):
        open_fallback_log()
    assert other.read_text() == ""
    path.unlink()
    # A folder others may write in.
    folder.chmod(0o755)
    with pytest.raises(UnsafeFolder) as loose:
        open_fallback_log()
    assert "has mode 0755, not 0700" in str(loose.value.strerror)
    folder.chmod(0o700)
    # A folder of another user's (only root can make one to test with).
    if os.getuid() == 0:
        os.chown(folder, 65534, 65534)
        with pytest.raises(UnsafeFolder) as theirs:
            open_fallback_log()
        assert "belongs to user 65534, not to you" in str(theirs.value.strerror)
        assert not (folder / "engine.log").exists()


def test_settings_and_tapes_replace_a_0644_file_privately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    from tui.settings import AppSettings

    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "settings.json").write_text(json.dumps({"theme": "x"}))
    assert _mode(folder / "settings.json") == 0o644
    AppSettings.load(folder).save(only=("cursor_blink",))
    assert _mode(folder / "settings.json") == 0o600
    assert json.loads((folder / "settings.json").read_text())["theme"] == "x"
    assert _mode(folder) == 0o755  # a folder the user made is theirs to set
