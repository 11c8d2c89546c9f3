"""A loopback port for a server the tests or benchmarks start, that nothing else takes
before the server binds it.

Why not the kernel's port 0: that port comes from the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 here), where every outgoing
connection also takes its source port. A vLLM server binds its KV-event ports only after
its model loads, tens of seconds after the port was chosen, while the other test worker
makes thousands of connections: one took a fleet server's port once ("Address already in
use"), and the fleet's three tests failed. So ports come from below that range, in an
order of this process's own (two processes seldom walk the same ports at once), never
the same one twice in a process, and each is checked free when handed out.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above the ports services are usually configured on


def _below_ephemeral() -> range:
    try:
        first = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768  # Linux's default start
    return range(LOWEST, max(LOWEST + 1000, first))


_ports = _below_ephemeral()
_order = random.Random(os.getpid()).sample(_ports, len(_ports))
_handed_out: set[int] = set()


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on now, outside the ephemeral range."""
    for port in _order:
        if port not in _handed_out and _free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free loopback port among {len(_order)} below the ephemeral range")
