"""The over-saturation watch, fed a point's sends, first tokens and ends in time order.

Each point is simulated exactly: constant arrivals at `rate`, a server with `slots`
slots (0: as many as asked) that holds each request `service_s`, TTFT `ttft_s` after it
gets a slot. The watch is asked for its verdict after every event, as the load loop does.
"""

from __future__ import annotations

import heapq

from bench.saturation import SaturationWatch


def _verdicts(rate: float, service_s: float, ttft_s: float, slots: int, n: int) -> list[str]:
    watch = SaturationWatch()
    events: list[tuple[float, int, str, float]] = []
    free_at = [0.0] * slots
    for i in range(n):
        sent = i / rate
        start = sent
        if slots:
            start = max(sent, heapq.heappop(free_at))
            heapq.heappush(free_at, start + service_s)
        events.append((sent, i, "sent", sent))
        events.append((start + ttft_s, i, "first", sent))
        events.append((start + service_s, i, "ended", sent))
    said = []
    for at, _i, kind, sent in sorted(events):
        if kind == "sent":
            watch.sent(at)
        elif kind == "first":
            watch.first_token(sent, at - sent)
        else:
            watch.ended(at)
        verdict = watch.verdict(at)
        if verdict:
            said.append(verdict)
    return said


def test_the_ramp_up_to_a_steady_queue_is_not_over_saturation() -> None:
    # 24 requests/s, each 0.38 s long, no limit: about 9 outstanding once the first reply
    # is back (Little's law), and never more. The rise from 0 to 9 is the point starting.
    assert _verdicts(rate=24, service_s=0.38, ttft_s=0.2, slots=0, n=96) == []


def test_a_point_under_the_capacity_of_four_slots_is_not_over_saturated() -> None:
    # 4 slots of 0.38 s serve 10.5 requests/s; 9 a second never queue.
    assert _verdicts(rate=9, service_s=0.38, ttft_s=0.2, slots=4, n=40) == []


def test_a_point_past_the_capacity_of_four_slots_is_over_saturated() -> None:
    # 16 requests/s into 10.5 a second of slots: the queue grows by 5.5 a second.
    said = _verdicts(rate=16, service_s=0.38, ttft_s=0.2, slots=4, n=64)
    assert said and said[0].startswith("over-saturated"), said
