"""vLLM's own router (`vllm-router`, Rust) on loopback in front of two fake replicas.

What it tells about where a request went: no response header names the worker (it echoes
x-request-id only), but its Prometheus counter per worker does, one request at a time.
Skipped, with the reason, where the router package is not installed (`pip install
kvscope[fleet]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from fleet_fakes import MODEL, FakeReplica
from real_fleet import NO_ROUTER, Router, router_installed

from engine.fleet.attribution import attribute, from_headers, from_router_metrics
from engine.fleet.replicas import parse_replicas

if TYPE_CHECKING:
    from collections.abc import Iterator

    import httpx

pytestmark = pytest.mark.skipif(not router_installed(), reason=NO_ROUTER)


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Router, FakeReplica, FakeReplica]]:
    with FakeReplica("a") as a, FakeReplica("b") as b:
        router = Router([a.url, b.url], "round_robin")
        try:
            router.wait_ready()
            yield router, a, b
        finally:
            router.stop()


def _chat(router: Router, n: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": f"hello {n}"}],
    }
    headers = {"x-request-id": f"kvscope-{n}"}
    return router.http.post(router.url + "/v1/chat/completions", json=body, headers=headers)


def test_round_robin_alternates_and_each_request_is_attributed_from_the_router_counter(
    fleet: tuple[Router, FakeReplica, FakeReplica],
) -> None:
    router, a, b = fleet
    replicas = parse_replicas([f"a={a.url}", f"b={b.url}"])
    served: list[str] = []
    for n in range(4):
        before = router.counters()
        reply = _chat(router, n)
        assert reply.status_code == 200
        truth = "a" if "from a" in reply.text else "b"
        header = from_headers(reply.headers, replicas)
        assert header.replica is None  # 0.1.17 names no worker in its answer
        assert reply.headers["x-request-id"] == f"kvscope-{n}"  # echoed, and passed on
        found = attribute(header, from_router_metrics(before, router.counters(), replicas))
        assert (found.replica, found.source) == (truth, "router metrics")
        served.append(truth)
    assert sorted(served) == ["a", "a", "b", "b"]
    assert served[0] != served[1]
    sent = [h for path, h in a.requests + b.requests if path == "/v1/chat/completions"]
    assert {h.get("x-request-id") for h in sent} == {f"kvscope-{n}" for n in range(4)}


def test_the_routers_workers_are_the_replicas(
    fleet: tuple[Router, FakeReplica, FakeReplica],
) -> None:
    router, a, b = fleet
    workers = router.http.get(router.url + "/workers").json()["workers"]
    replicas = parse_replicas([a.url, b.url])
    names = sorted(r.name for w in workers if (r := replicas.at(w["url"])) is not None)
    assert names == ["a", "b"]
    assert all(w["is_healthy"] for w in workers)
