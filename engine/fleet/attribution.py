"""Which replica served a request, and how that is known.

Four sources, tried in this order; the answer always names the one it used:
- kvscope's own round robin, when there is no router (`--replica` without `--url`):
  kvscope chose the replica, so it knows;
- a response header whose value is a replica's URL (a proxy's `X-Upstream`, say).
  vllm-router 0.1.17 sends none: it echoes `x-request-id` and nothing naming the worker;
- the router's own Prometheus counter `vllm_router_processed_requests_total{worker=URL}`
  (its --prometheus-port, not its /metrics, which it forwards to one worker), read just
  before and just after the request: exact only when that request was the only one the
  router sent in between, so more than one new request makes it say it cannot tell;
- the replicas' KV events (engine/fleet/prefix_index.py's ActivityMark): the replica whose
  events stored or re-reported blocks for this request's session while it ran. A turn
  shorter than a block, with nothing re-reported, leaves no event and no answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client.parser import text_string_to_metric_families

from engine.remote.vllm_metrics import ROUTER_PROCESSED

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.fleet.prefix_index import ActivityMark
    from engine.fleet.replicas import ReplicaSet

Source = Literal[
    "round robin", "disaggregated", "router header", "router metrics", "kv events", "none"
]

# Short: they end a reply's footer ("served by b (router counter)").
_SOURCE_WORDS: dict[Source, str] = {
    "round robin": "kvscope's round robin",
    "disaggregated": "kvscope's prefill/decode proxy",
    "router header": "router header",
    "router metrics": "router counter",
    "kv events": "KV events",
    "none": "",
}


@dataclass(frozen=True)
class Attribution:
    """The replica that served a request (None if not known), and from what."""

    replica: str | None
    source: Source
    note: str = ""  # why not known, or what the answer rests on

    def words(self) -> str:
        if self.replica is None:
            return f"served by: not known ({self.note})" if self.note else "served by: not known"
        return f"served by {self.replica} ({_SOURCE_WORDS[self.source]})"


def from_round_robin(replica: str | None) -> Attribution:
    """The replica kvscope itself sent the request to."""
    if replica is None:
        return Attribution(None, "none", "kvscope's round robin has no record of it")
    return Attribution(replica, "round robin", f"kvscope sent it to {replica}")


def from_headers(headers: Mapping[str, str], replicas: ReplicaSet) -> Attribution:
    """A response header that names a replica by its URL."""
    for name, value in headers.items():
        if "://" not in value:
            continue
        replica = replicas.at(value.strip())
        if replica is not None:
            return Attribution(replica.name, "router header", f"{name}: {replica.url}")
    return Attribution(None, "none", "no response header names a replica")


def router_counts(text: str) -> dict[str, float]:
    """Requests the router has sent to each worker URL, from its Prometheus text.

    prometheus_client's own parser, not engine/remote/metrics.py's: that one keeps only
    vLLM's `vllm:` samples, and the router's are `vllm_router_`. Text that does not parse
    counts nothing.
    """
    counts: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                worker = sample.labels.get("worker")
                if sample.name == ROUTER_PROCESSED and worker:
                    counts[worker] = counts.get(worker, 0.0) + float(sample.value)
    except ValueError:
        return {}
    return counts


def metrics_page_problem(text: str) -> str | None:
    """Why `text` is not a Prometheus metrics page (JSON, HTML, nothing), in words with
    how it starts; None when it is one."""
    start = f"it starts {text.strip()[:40]!r}" if text.strip() else "it is empty"
    try:
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
    except ValueError:
        return f"{start}, which is not Prometheus text"
    return None if samples else f"{start}: no metric in it"


def from_router_metrics(before: str, after: str, replicas: ReplicaSet) -> Attribution:
    """The worker whose counter rose by one between the two scrapes, if only one did."""
    then = router_counts(before)
    now = router_counts(after)
    grew = {url: now[url] - then.get(url, 0.0) for url in now if now[url] > then.get(url, 0.0)}
    total = sum(grew.values())
    if not now:
        return Attribution(None, "none", f"the router's metrics have no {ROUTER_PROCESSED}")
    if total == 0:
        return Attribution(None, "none", "the router counted no request in between")
    if total > 1:
        return Attribution(
            None,
            "none",
            f"the router sent {total:.0f} requests in between, so its counters cannot say "
            "which was this one",
        )
    (url,) = grew
    replica = replicas.at(url)
    if replica is None:
        return Attribution(None, "none", f"the router sent it to {url}, which is no --replica")
    return Attribution(replica.name, "router metrics", f"{ROUTER_PROCESSED} at {url} +1")


def from_kv_events(before: ActivityMark, after: ActivityMark, session_id: str) -> Attribution:
    """The one replica whose KV events stored blocks for `session_id` in between."""
    grew = {
        name: n - before.by_session.get(name, {}).get(session_id, 0)
        for name, sessions in after.by_session.items()
        if (n := sessions.get(session_id, 0)) > before.by_session.get(name, {}).get(session_id, 0)
    }
    if len(grew) == 1:
        ((name, blocks),) = grew.items()
        return Attribution(name, "kv events", f"{blocks} blocks of session {session_id} on {name}")
    if grew:
        names = ", ".join(sorted(grew))
        return Attribution(
            None, "none", f"KV events for session {session_id} came from {names} at once"
        )
    return Attribution(
        None,
        "none",
        f"no replica's KV events stored a block for session {session_id} meanwhile (a turn "
        "shorter than one block stores none)",
    )


def attribute(*answers: Attribution) -> Attribution:
    """The first answer that names a replica, else every reason it is not known."""
    for answer in answers:
        if answer.replica is not None:
            return answer
    notes = "; ".join(a.note for a in answers if a.note)
    return Attribution(None, "none", notes)
