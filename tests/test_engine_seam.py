"""The engine seam: every engine a command opens comes from cli/engine_choice.py's KINDS, and
whether a tape's steps are real steps is on its card, not read off a device string."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import TYPE_CHECKING, Any

import pytest

import cli.engine_choice
from cli.bench import add_bench_parser, bench_engine
from cli.main import _parser
from engine.errors import BadOption
from engine.events import ModelCard
from engine.fake import FakeEngine
from engine.remote.engine import RemoteEngine
from engine.replay.engine import ReplayEngine
from engine.tape import read_tape
from engine.tape.format import CardRecord, Decoder, Encoder, dumps

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator
    from pathlib import Path

    from engine.protocol import Engine

# A card as every tape recorded before `exact_steps` holds it: no such field.
OLD_CARD: dict[str, Any] = {
    "name": "SmolLM2-135M-Instruct",
    "path": "SmolLM2-135M-Instruct",
    "dtype": "bfloat16",
    "num_layers": 30,
    "num_kv_heads": 3,
    "head_dim": 64,
    "kv_bytes_per_token": 23040,
    "max_model_len": 4352,
    "block_size": 128,
    "total_blocks": 44,
    "device": "cpu",
    "emulation": None,
    "unknown": [],
    "parallel": "",
}
HEADER = {"kvscope_tape": 1, "created": "2026-01-01T00:00:00+00:00", "t0": 0.0}
HEADER |= {"clock": "perf_counter", "writer": "kvscope"}


def _tape_with_card(path: Path, card: dict[str, Any]) -> Path:
    lines = [HEADER, ["c", 1.0, card], ["e", 2.0, "closed", ""]]
    path.write_text("".join(json.dumps(v) + "\n" for v in lines), "utf-8")
    return path


def _old_rule(device: str) -> bool:
    """How a tape's exact steps were decided before the card said: from its device."""
    return not device.startswith("remote ")


# -- tapes recorded before the field -----------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda", "fake", "remote http://127.0.0.1:8000"])
def test_an_old_tapes_card_reads_as_it_always_has(tmp_path: Path, device: str) -> None:
    path = _tape_with_card(tmp_path / "old.jsonl", {**OLD_CARD, "device": device})
    tape = read_tape(path)
    assert tape.card is not None and tape.card.exact_steps is None  # the file does not say
    assert tape.exact_steps is _old_rule(device)
    assert ReplayEngine(tape).features.exact_steps is _old_rule(device)


def test_an_old_card_is_written_back_without_the_field() -> None:
    # A tape read and written again is the same bytes: the reader's answer is not added.
    line = dumps(["c", 1.0, OLD_CARD])
    value, at = Decoder().decode(json.loads(line))
    assert isinstance(value, CardRecord)
    assert dumps(Encoder().encode("card", value.card, at)) == line


def test_a_tape_without_a_card_has_exact_steps_as_before(tmp_path: Path) -> None:
    path = tmp_path / "no-card.jsonl"
    path.write_text(json.dumps(HEADER) + "\n", "utf-8")
    assert read_tape(path).exact_steps is True


# -- tapes written now -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "exact"),
    [
        ("cpu", True),
        ("remote http://127.0.0.1:8000", False),
        # The field is what answers, not the device: a card may say either.
        ("cpu", False),
        ("remote http://127.0.0.1:8000", True),
    ],
)
def test_a_new_card_round_trips_the_field(tmp_path: Path, device: str, exact: bool) -> None:
    card = ModelCard(**{**OLD_CARD, "unknown": (), "device": device, "exact_steps": exact})
    record = Encoder().encode("card", card, 1.0)
    assert record[2]["exact_steps"] is exact  # written, whatever the device says
    value, _ = Decoder().decode(json.loads(dumps(record)))
    assert isinstance(value, CardRecord) and value.card == card
    path = _tape_with_card(tmp_path / "new.jsonl", record[2])
    assert read_tape(path).exact_steps is exact


def test_each_engine_puts_its_own_answer_on_its_card() -> None:
    fake = FakeEngine()
    card = fake.start()
    try:
        assert card.exact_steps is True and fake.features.exact_steps is True
    finally:
        fake.shutdown()
    # An attached server: its card, built as start() builds it once the server answered.
    remote = RemoteEngine("http://127.0.0.1:9")
    remote_card = remote._make_card("m", 4096, "m")
    assert remote_card.exact_steps is False and remote.features.exact_steps is False


# -- cli/bench.py opens its engines through KINDS -----------------------------------------------


def _bench_args(*argv: str) -> tuple[argparse.Namespace, list[str]]:
    return _parser(add_bench_parser).parse_known_args(["bench", *argv])


@pytest.mark.parametrize(
    ("argv", "kind"),
    [(["--fake"], "fake"), (["--url", "http://127.0.0.1:9"], "server"), ([], "vllm")],
)
def test_bench_opens_every_kind_through_the_registry(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], kind: str
) -> None:
    assert {k.name for k in cli.engine_choice.KINDS} == {"fake", "server", "vllm"}, (
        "a new kind: add the bench flags that ask for it here"
    )
    opened: list[str] = []
    sentinel: Any = object()

    def stand_in(name: str) -> Any:
        @contextlib.contextmanager
        def started(_a: argparse.Namespace, _v: list[str], _c: object) -> Iterator[Engine]:
            opened.append(name)
            yield sentinel

        return started

    kinds = tuple(dataclasses.replace(k, started=stand_in(k.name)) for k in cli.engine_choice.KINDS)
    monkeypatch.setattr(cli.engine_choice, "KINDS", kinds)
    args, engine_argv = _bench_args(*argv)
    with bench_engine(args, engine_argv, check=None) as engine:
        assert engine is sentinel
    assert opened == [kind]


def test_bench_fake_writes_the_field_on_its_tape(tmp_path: Path) -> None:
    path = tmp_path / "fake.jsonl"
    args, engine_argv = _bench_args("--fake", "--tape", str(path))
    with bench_engine(args, engine_argv, check=None) as engine:
        assert engine.card is not None and engine.card.device == "fake"
    card_line = path.read_text("utf-8").splitlines()[1]
    assert json.loads(card_line)[2]["exact_steps"] is True
    assert read_tape(path).exact_steps is True


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--max-num-seqs", "4"], "--max-num-seqs"),
        (["--url", "http://127.0.0.1:9"], "--fake"),
    ],
)
def test_bench_fake_refuses_what_it_cannot_take_before_any_tape(
    tmp_path: Path, argv: list[str], option: str
) -> None:
    path = tmp_path / "refused.jsonl"
    args, engine_argv = _bench_args("--fake", "--tape", str(path), *argv)
    with pytest.raises(BadOption) as caught, bench_engine(args, engine_argv, check=None):
        pass
    assert caught.value.option == option
    assert not path.exists()


def test_bench_fake_with_replicas_still_runs_the_fake() -> None:
    # `--replica` alone stands in for `--url`; that must not make the fake refuse it.
    args, engine_argv = _bench_args("--fake", "--replica", "http://127.0.0.1:9")
    with bench_engine(args, engine_argv, check=None) as engine:
        assert engine.card is not None and engine.card.device == "fake"
