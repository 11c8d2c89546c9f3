"""`bench --fake` (#31 item 11): the fake engine's timings are its script, so a run on it
says so in its title and draws no conclusion about this machine (neither "memory-bound"
nor "this host was busy"), whatever the host's load while it ran."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from cli import sweep_table
from cli.main import main
from cli.sweep_table import SCRIPTED, SIMULATED

if TYPE_CHECKING:
    from collections.abc import Sequence


def _bench(args: Sequence[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["bench", "--fake", *args])
    out, _ = capsys.readouterr()
    assert code == 0, out
    return " ".join(out.split())  # rich wraps at its width: read the words, not the lines


@pytest.fixture
def busy_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host as a loaded CI machine has it: five times busier than its cores."""
    monkeypatch.setattr(sweep_table, "host_load", lambda: (10.0, 2))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(
            [
                "--concurrency",
                "1,4",
                "--prompt-lens",
                "32",
                "--output-len",
                "4",
                "--num-prompts",
                "8",
            ],
            id="load",
        ),
        pytest.param(["--prompt-lens", "64,256", "--output-len", "4"], id="prompt-sweep"),
    ],
)
def test_a_fake_run_says_its_timings_are_scripted_and_concludes_nothing_about_the_host(
    args: list[str], busy_host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _bench(args, capsys)
    assert f"kvscope bench ({SIMULATED}):" in said
    assert " ".join(SCRIPTED.split()) in said
    for conclusion in ("memory-bound", "compute-bound", "host was busy", "saturated"):
        assert conclusion not in said, conclusion
