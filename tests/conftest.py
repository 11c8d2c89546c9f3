"""Shared fixtures and marks. The real engine starts once per test session (about 15 s on 2
cores); a test that imports vLLM is marked `engine`, and a run without them checks that vLLM
stayed out of the process."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from session_engine import ENGINE_ARGV
from vllm_imports import VllmImports, scan_source
from work_meter import METER

from tui.settings import CONFIG_DIR_ENV

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from real_fleet import RealFleet
    from remote_server import VllmServer


def _poll_idle_finer() -> None:
    """Textual's pilot waits, at each `pause()`, until the process used under 1/20 of a
    poll's time, polling every 20 ms: most pauses find the app idle at the first poll, so
    each costs 20 ms asleep, and `settle` pauses at least eight times. Polling every 5 ms
    (the same 1/20 rule) took two UI files from 93 and 89 s to 74 and 77 s on the 2-core
    EPYC with the same CPU time; the tests' own waits are on the app's state (`settle`),
    not on these polls."""
    import textual._wait as idle

    # Both names are read when wait_for_idle runs; fail loudly when Textual renames them.
    assert hasattr(idle, "SLEEP_GRANULARITY") and hasattr(idle, "SLEEP_IDLE")
    idle.SLEEP_GRANULARITY = 1 / 200
    idle.SLEEP_IDLE = idle.SLEEP_GRANULARITY / 20


_poll_idle_finer()

# Every engine the tests run in a process of theirs (the session's, and each `kvscope` a
# test starts) computes on one OpenMP thread. vLLM binds threads only in its multiprocess
# executor (a server's worker: one thread on its core); an in-process engine takes torch's
# default, one thread per core, and two such teams on two cores wait at each other's
# barriers: beside a `kvscope generate` decoding, test_engine_protocol's block-count test
# took 4.8 s where it takes 0.85 s alone, and 1.2 s with one thread in each engine. Set
# before anything imports torch (nothing above does), so this process and every process it
# starts read it; a value set outside the tests is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _vllm_loaded() -> bool:
    # A test may block the import with `sys.modules["vllm"] = None`: that is not vLLM.
    return sys.modules.get("vllm") is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that uses the session's engine or server, or imports vLLM, pays for vLLM;
    # `make test-fast` skips them.
    scans: dict[Path, VllmImports] = {}
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if {"vllm_engine", "vllm_server", "real_fleet"} & set(item.fixturenames):
            item.add_marker(pytest.mark.engine)
        else:
            if item.path not in scans:
                scans[item.path] = scan_source(item.path.read_text())
            name = f"{item.cls.__name__}.{item.originalname}" if item.cls else item.originalname
            if scans[item.path].marks(name):
                item.add_marker(pytest.mark.engine)
        if item.get_closest_marker("own_engine") is not None:
            # vLLM only in a subprocess of the test's own: it runs in whichever worker is
            # free, beside the session's engine (each on one OpenMP thread, see above).
            shared = {"vllm_engine", "vllm_server", "real_fleet"} & set(item.fixturenames)
            if shared:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked own_engine but uses {sorted(shared)}"
                )
            item.add_marker(pytest.mark.engine)
            continue
        if item.get_closest_marker("engine") is not None:
            # Under `make test` (pytest-xdist, --dist loadgroup) every engine test runs in
            # one worker: the session's engine, server and fleet start once, and the vLLM
            # model worker keeps its one core while the other worker runs the UI tests.
            item.add_marker(pytest.mark.xdist_group("engine"))


# Where each test ran and when (one line per test: worker, start, seconds, test id), for
# `.ci/run`'s summary of how busy each worker was: which one the suite waited for.
TIMELINE_ENV = "KVSCOPE_TEST_TIMELINE"


# Each line also says what the test asked of vLLM (tests/work_meter.py: prefill and
# decode seconds, prefill tokens), from which scripts/test_timeline.py estimates the suite
# on a slower CPU, and whether it starts vLLM in a subprocess of its own (not counted).


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get(TIMELINE_ENV)
    # Servers are read around engine tests only: the others cannot make one work.
    servers = item.get_closest_marker("engine") is not None
    if path:
        METER.count_engines()
        before = METER.reading(servers)
    began = time.time()
    yield
    if path:
        took = time.time() - began
        METER.count_engines()
        work = METER.reading(servers) - before
        own = int(item.get_closest_marker("own_engine") is not None)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a", encoding="utf-8") as out:
            out.write(
                f"{worker}\t{began:.3f}\t{took:.3f}\t{item.nodeid}\t{work.prefill_s:.3f}\t"
                f"{work.decode_s:.3f}\t{work.prefill_tokens}\t{own}\n"
            )


@pytest.fixture(autouse=True)
def _vllm_only_under_the_engine_mark(request: pytest.FixtureRequest) -> Iterator[None]:
    # The scan reads imports; this catches the rest (a helper module that imports vLLM for
    # the test), naming the test. Once vLLM is loaded, later tests cannot be told apart.
    before = _vllm_loaded()
    yield
    if not before and _vllm_loaded() and request.node.get_closest_marker("engine") is None:
        pytest.fail(
            f"{request.node.nodeid} imported vLLM but is not marked `engine`, so "
            '`make test-fast` (-m "not engine") pays for vLLM: mark it',
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Catches what the fixture above cannot: an import at collection or in a wider fixture.
    if _vllm_loaded() and not any(i.get_closest_marker("engine") for i in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")  # after the progress dots
            reporter.write_line(
                "kvscope tests: vLLM was imported by a run that selected no `engine` test; "
                "a test imports it without the mark (see tests/conftest.py)",
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def snap_compare(
    snap_compare: Callable[..., bool], request: pytest.FixtureRequest
) -> Callable[..., bool]:
    """pytest-textual-snapshot's comparison, printing the changed rows when it fails."""
    import textual._doc
    from snapshot_diff import rows_diff, snapshot_file

    take = textual._doc.take_svg_screenshot
    taken: list[str] = []

    def taking(*args: Any, **kwargs: Any) -> str:
        svg = take(*args, **kwargs)
        taken.append(svg)
        return svg

    def compare(*args: Any, **kwargs: Any) -> bool:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(textual._doc, "take_svg_screenshot", taking)
            same = snap_compare(*args, **kwargs)
        accepted = snapshot_file(request.path, request.node.name)
        if not same and taken and accepted.exists():
            print(
                "snapshot rows that differ:\n"
                + (
                    rows_diff(accepted.read_text(), taken[-1])
                    or "(text the same: colours or styles differ)"
                )
            )
        return same

    return compare


@pytest.fixture(autouse=True)
def tui_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point kvscope's settings at a temporary folder: no test reads the user's own file."""
    folder = tmp_path / "kvscope-config"
    monkeypatch.setenv(CONFIG_DIR_ENV, str(folder))
    return folder


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[object]:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch

    from engine.vllm.engine import VllmEngine

    # torch read OMP_NUM_THREADS when first imported: this fails if something imported it
    # before this file set it (see the top of this file).
    threads = int(os.environ["OMP_NUM_THREADS"])
    assert torch.get_num_threads() == threads, (torch.get_num_threads(), threads)
    engine = VllmEngine(argv=ENGINE_ARGV)
    engine.start()
    METER.count(engine)  # it may start before the meter could patch VllmEngine.start
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One real vLLM server on loopback for the whole session (tests/remote_server.py),
    shared by the remote-engine tests and the engine contract tests."""
    from remote_server import VllmServer

    # With vLLM's FLOP and byte counters, as `vllm serve --enable-mfu-metrics` exports them:
    # attached bench points get their roofline figures from them (test_remote_engine).
    server = VllmServer(mfu_metrics=True).start()
    print(f"\nvLLM server healthy after {server.start_seconds:.1f} s at {server.url}")
    yield server
    server.stop()
    assert not server.group_alive(), "a vLLM server process outlived the tests"


@pytest.fixture(scope="session")
def real_fleet() -> Iterator[RealFleet]:
    """Two real vLLM servers and vllm-router on loopback, once per session (real_fleet.py)."""
    from real_fleet import running_fleet

    with running_fleet() as fleet:
        print(f"\nfleet of 2 servers and a router up after {fleet.start_seconds:.1f} s")
        yield fleet
