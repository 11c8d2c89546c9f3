"""Goodput under service-level objectives, as `vllm bench serve --goodput` defines it.

`--goodput ttft:2000 tpot:100 e2el:5000` (milliseconds, vLLM's syntax). A completed
request is good when each named figure is at most its objective: TTFT, TPOT (end-to-end
minus TTFT over the output tokens after the first; 0 for a one-token reply, as vLLM
counts it for goodput) and E2EL. `request_goodput` is good requests per second of the
point's duration. Beside it, the share of requests within each objective, out of every
request the point sent: a request that failed or never finished met no objective, so a
server that answers most requests with an HTTP 500 cannot score 100% on the ones it served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import BadOption

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SLO_NAMES = ("ttft", "tpot", "e2el")


def parse_goodput(pairs: Sequence[str]) -> dict[str, float]:
    """{"ttft": 2000.0, ...} from ["ttft:2000", ...]; BadOption names what is wrong."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        name = name.strip().lower()
        if not sep or not name:
            raise BadOption("--goodput", f"{pair!r} is not KEY:MS (e.g. ttft:2000 tpot:100)")
        if name not in SLO_NAMES:
            raise BadOption("--goodput", f"{name!r} is not one of {', '.join(SLO_NAMES)}")
        try:
            ms = float(value)
        except ValueError:
            raise BadOption("--goodput", f"{value!r} in {pair!r} is not a number of ms") from None
        if math.isnan(ms):
            raise BadOption("--goodput", f"{pair!r}: {value.strip()!r} is not a number of ms")
        if ms < 0:
            raise BadOption("--goodput", f"{pair!r}: an objective cannot be negative")
        if name in out:
            # Two limits on one figure: keeping either would drop the other in silence.
            raise BadOption(
                "--goodput",
                f"{name} is given twice ({_ms_text(out[name])} and {_ms_text(ms)} ms): "
                "give each objective once",
            )
        out[name] = ms
    if not out:
        raise BadOption("--goodput", "give at least one KEY:MS, e.g. ttft:2000")
    return out


def _ms_text(ms: float) -> str:
    return f"{ms:g}" if ms < 1e6 else f"{ms:,.0f}"


@dataclass(frozen=True, slots=True)
class RequestSlo:
    """One completed request's figures that objectives are set on, in seconds."""

    ttft_s: float
    tpot_s: float
    e2el_s: float

    @classmethod
    def of(cls, ttft_s: float | None, e2e_s: float, output_tokens: int) -> RequestSlo:
        ttft = math.inf if ttft_s is None else ttft_s
        tpot = (e2e_s - ttft) / (output_tokens - 1) if output_tokens > 1 else 0.0
        return cls(ttft, tpot, e2e_s)

    def value_s(self, name: str) -> float:
        return {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2el": self.e2el_s}[name]


@dataclass(frozen=True, slots=True)
class Goodput:
    good: int
    request_goodput: float  # good requests per second
    within: dict[str, float]  # per objective, the share of all requests within it
    all_within: float  # the share within every objective


def goodput(
    requests: Sequence[RequestSlo],
    slo_ms: Mapping[str, float],
    duration_s: float,
    *,
    missed: int = 0,
) -> Goodput:
    """vLLM's count: good when every objective holds (figure <= objective). `missed`
    requests (failed, or never finished) count in the shares as outside every objective."""
    limits = {name: ms / 1000.0 for name, ms in slo_ms.items()}
    good = sum(all(r.value_s(n) <= s for n, s in limits.items()) for r in requests)
    n = len(requests) + missed
    within = {name: sum(r.value_s(name) <= s for r in requests) / n if n else 0.0
              for name, s in limits.items()}  # fmt: skip
    return Goodput(
        good=good,
        request_goodput=good / duration_s if duration_s > 0 else 0.0,
        within=within,
        all_within=good / n if n else 0.0,
    )
