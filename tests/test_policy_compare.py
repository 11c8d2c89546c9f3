"""Routing policy, measured, end to end (issue #21, item 4): the real `vllm-router` under
round_robin and under cache_aware, each in front of the same two pretend replicas that keep
a prefix cache each and say per request how much of the prompt they found in it, and
`kvscope bench --turns N --sessions M --compare-urls ...` run as a user runs it.

Which policy comes out ahead is reported, not asserted: that is the measurement's answer
(benchmarks/routing_policy.py takes it on real vLLM servers), not a property of the code.
Skipped, with the reason, where the router package is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_helpers import KVSCOPE, one_line
from remote_server import (
    FakeRequest,
    FakeServer,
    Reply,
    free_port,
    sse,
    sse_event,
    text_reply,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from benchmarks.routing_policy import Router

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 4  # words per pretend KV block
# A hang guard for router start-up, not a speed: a loaded host can take many times its usual second.
ROUTER_TIMEOUT_S = 120.0

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm_router") is None,
    reason="vllm-router is not installed (pip install 'kvscope[fleet]')",
)


class CachingReplica:
    """A FakeServer whose chat replies carry `usage.prompt_tokens_details.cached_tokens`
    from a prefix cache of its own: whole blocks of the prompt's words, as vLLM's
    hashes whole blocks of tokens."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.blocks: set[tuple[str, ...]] = set()
        self.chats = 0
        self._lock = threading.Lock()
        self.server = FakeServer(
            {"/health": lambda _req: text_reply(""), "/v1/chat/completions": self._chat}
        )

    @property
    def url(self) -> str:
        return self.server.url

    def _chat(self, req: FakeRequest) -> Reply:
        body: dict[str, Any] = req.json() or {}
        words: list[str] = []
        for m in body.get("messages") or []:
            words += [f"<{m['role']}>", *str(m["content"]).split()]
        words.append("<assistant>")
        full = len(words) // BLOCK
        with self._lock:
            self.chats += 1
            cached = 0
            for k in range(1, full + 1):
                if tuple(words[: k * BLOCK]) not in self.blocks:
                    break
                cached = k * BLOCK
            self.blocks.update(tuple(words[: k * BLOCK]) for k in range(1, full + 1))
        n = int(body.get("max_tokens") or 4)
        parts: list[bytes | float | None] = []
        for i in range(n):
            last = i == n - 1
            choice = {
                "index": 0,
                "delta": {"content": f" {self.name}{i}"},
                "token_ids": [100 + i],
                "finish_reason": "length" if last else None,
            }
            parts.append(sse_event({"choices": [choice]}))
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": n,
            "total_tokens": len(words) + n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        metrics = {"time_to_first_token_ms": 1.0, "queue_time_ms": 0.0}
        parts.append(sse_event({"choices": [], "usage": usage, "metrics": metrics}))
        parts.append(b"data: [DONE]\n\n")
        return sse(*parts)

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[list[Router], list[CachingReplica]]]:
    from benchmarks.routing_policy import Router

    replicas = [CachingReplica("a"), CachingReplica("b")]
    workers = [r.url for r in replicas]
    routers: list[Router] = []
    try:
        for policy in ("round_robin", "cache_aware"):
            routers.append(Router(workers, policy, free_port(), free_port()))
        for router in routers:
            router.wait_ready(ROUTER_TIMEOUT_S)
        yield routers, replicas
    finally:
        for router in routers:
            router.stop()
        for r in replicas:
            r.stop()


def _bench(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KVSCOPE, "bench", *flags], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_two_router_policies_compared_on_one_fleet_end_to_end(
    fleet: tuple[list[Router], list[CachingReplica]], tmp_path: Path
) -> None:
    routers, replicas = fleet
    out = tmp_path / "policies.json"
    urls = ",".join(f"{r.policy}={r.url}" for r in routers)
    run = _bench(
        "--turns", "3", "--sessions", "3", "--message-len", "12", "--output-len", "4",
        "--seed", "9", "--warmup", "0", "--kv-events", "off",
        "--compare-urls", urls, "--json", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    # One table: a row per policy, TTFT and hit rate by turn, turns 2+, throughput.
    text = run.stdout
    assert "kvscope bench: routing, 3 chat session(s) x 3 turn(s)" in text
    for head in ("turn 1", "turn 2", "turn 3", "turns 2+", "prefix hit", "out tok/s", "req/s"):
        assert head in text
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│ ")]
    assert rows == ["round_robin", "cache_aware"]
    # The sentence says which way it came out, with the ratio, whichever way that is.
    flat = " ".join(text.split())
    assert "cache_aware against round_robin: prefix hit rate (turns 2-3)" in flat
    assert "mean TTFT (turns 2-3)" in flat and "output throughput x" in flat
    # The JSON: every request of each policy, with the router's URL, kept private.
    data = json.loads(out.read_text())
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert data["kind"] == "multi_turn_compare" and data["seed"] == 9
    assert " ".join(data["verdict"].split()) in flat
    assert list(data["policies"]) == ["round_robin", "cache_aware"]
    for router in routers:
        entry = data["policies"][router.policy]
        assert entry["url"] == router.url and entry["complete"] is True
        assert entry["completed"] == 9 and entry["failed"] == 0
        assert [t["turns"] for t in entry["turns"]] == ["1", "2", "3"]
        requests = entry["requests"]
        assert {(r["session"], r["turn"]) for r in requests} == {
            (s, t) for s in range(3) for t in range(1, 4)
        }
        assert all(r["cached_prompt_tokens"] is not None for r in requests)
        assert all(r["cached_prompt_tokens"] == 0 for r in requests if r["turn"] == 1)
        assert entry["later_turns"]["hit_rate"] is not None
    assert sum(r.chats for r in replicas) == 18  # through the routers, to the replicas
    assert all(r.chats > 0 for r in replicas)
    ca = data["policies"]["cache_aware"]["later_turns"]["hit_rate"]
    rr = data["policies"]["round_robin"]["later_turns"]["hit_rate"]
    print(f"\nprefix hit rate, turns 2-3: cache_aware {ca:.0%}, round_robin {rr:.0%}")


def test_a_comparison_that_cannot_attach_says_which_url_in_one_line() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    other = f"http://127.0.0.1:{free_port()}"  # one URL twice is refused before any attach
    run = _bench(
        "--turns", "2", "--sessions", "1", "--timeout", "2",
        "--compare-urls", f"a={dead},b={other}",
    )  # fmt: skip
    assert run.returncode != 0
    said = one_line(run.stderr, "--compare-urls a (", besides=("kvscope: a: ",))
    assert dead in said
