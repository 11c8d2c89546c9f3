"""The servers' ports come from below the ephemeral range, where no outgoing connection
takes its source port, and are never handed out twice or while something listens."""

from __future__ import annotations

import socket

import pytest

from benchmarks import loopback_port
from benchmarks.loopback_port import EPHEMERAL_RANGE, free_port


def test_ports_are_below_the_ephemeral_range_and_never_the_same_twice() -> None:
    ephemeral_start = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(loopback_port.LOWEST <= p < ephemeral_start for p in ports), ports


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as idle:
            idle.bind(("127.0.0.1", 0))
            free = idle.getsockname()[1]
        monkeypatch.setattr(loopback_port, "_order", [busy, free])
        monkeypatch.setattr(loopback_port, "_handed_out", set())
        assert free_port() == free
        with pytest.raises(RuntimeError, match="no free loopback port"):
            free_port()
