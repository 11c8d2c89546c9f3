"""Preemption, explained: what the step samples show when vLLM evicts a request.

A preemption is the demo's wall made visible, but a counter going to 1 teaches nothing.
From two consecutive samples (the one before the step, the one of the step) and the
request tracks the UI already keeps, the note says that the pool was full, which request
was evicted, how many blocks came back, and that its prompt and output will be computed
again. When the evicted request makes its next token, the note adds what that cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tui import format as fmt

if TYPE_CHECKING:
    from engine.events import StepSample
    from tui.telemetry.request_status import RequestTrack
    from tui.telemetry.timeline import Timeline


@dataclass(frozen=True)
class Victim:
    """One request a step evicted, as the samples showed it just before."""

    request_id: str
    blocks: int  # the blocks it held before the step: all went back to the pool
    prompt_tokens: int | None  # None: a request this session's UI never saw accepted
    output_tokens: int


@dataclass(frozen=True)
class PreemptionCost:
    """What a preemption cost its victim, known once the victim made a token again."""

    waited_s: float  # from the preempting step's end to the victim's next token
    recomputed_tokens: int  # prefill the victim ran again over that time
    recompute_steps: int
    recompute_s: float  # those steps' time


@dataclass(frozen=True)
class Preemption:
    """The latest step that preempted, and why, in numbers."""

    step: int
    at: float  # engine time at the end of the step
    victims: tuple[Victim, ...]
    free_before: int
    total_blocks: int
    newest: bool  # the victims were the requests admitted last (vLLM's FCFS choice)
    cost: PreemptionCost | None = None

    @property
    def blocks_back(self) -> int:
        return sum(v.blocks for v in self.victims)

    def with_cost(self, cost: PreemptionCost) -> Preemption:
        return replace(self, cost=cost)


def observe(
    before: StepSample | None,
    sample: StepSample,
    tracks: dict[str, RequestTrack],
) -> Preemption | None:
    """The preemption `sample` shows, read against the sample `before` it (None if none)."""
    if not sample.preempted_ids:
        return None
    held = {b.request_id: b for b in before.blocks} if before is not None else {}
    order = [b.request_id for b in before.blocks] if before is not None else []
    victims: list[Victim] = []
    for rid in sample.preempted_ids:
        blocks = held.get(rid)
        track = tracks.get(rid)
        count = len(blocks.block_ids) if blocks is not None else 0
        if blocks is None and track is not None and track.computed:
            count = math.ceil(track.computed / max(1, sample.block_size))
        victims.append(
            Victim(
                rid,
                count,
                track.prompt_tokens if track is not None else None,
                track.tokens if track is not None else 0,
            )
        )
    ids = set(sample.preempted_ids)
    # vLLM's FCFS scheduler evicts from the end of its running list: the newest first.
    newest = bool(order) and set(order[-len(ids) :]) == ids
    return Preemption(
        step=sample.step,
        at=sample.started_at + sample.duration_s,
        victims=tuple(victims),
        free_before=before.free_blocks if before is not None else sample.free_blocks,
        total_blocks=sample.total_blocks,
        newest=newest,
    )


def cost_of(
    preemption: Preemption, request_id: str, token_at: float, timeline: Timeline
) -> PreemptionCost | None:
    """What the preemption cost `request_id`, whose next token came at `token_at`."""
    if preemption.cost is not None or token_at <= preemption.at:
        return None
    if request_id not in {v.request_id for v in preemption.victims}:
        return None
    tokens = steps = 0
    seconds = 0.0
    for record in timeline.steps_in(preemption.at, token_at):
        ran = sum(p for rid, p, _ in record.work if rid == request_id)
        if ran > 0:
            tokens += ran
            steps += 1
            seconds += record.duration_s
    return PreemptionCost(token_at - preemption.at, tokens, steps, seconds)


def _names(ids: list[str]) -> str:
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]


def preemption_words(p: Preemption) -> str:
    """The note under the engine's step line: a few short sentences, with the numbers.

    "⚠ Step 2 preempted r1.4: the running requests needed more KV blocks than were free
    (2 of 10), so vLLM evicted the newest; its 2 blocks came back. Its 256 prompt and 1
    output tokens are recomputed when it runs again. Cost: next token 660 ms later,
    256 tokens recomputed in 1 step (35.6 ms)."
    """
    ids = [v.request_id for v in p.victims]
    one = len(ids) == 1
    its = "its" if one else "their"
    why = (" the newest" if one else " the newest ones") if p.newest else ""
    words = (
        f"⚠ Step {p.step:,} preempted {_names(ids)}: the running requests needed more KV "
        f"blocks than were free ({p.free_before:,} of {p.total_blocks:,}), so vLLM evicted"
        f"{why or (' it' if one else ' them')}; {its} {fmt.count(p.blocks_back, 'block')} "
        "came back."
    )
    known = [v for v in p.victims if v.prompt_tokens is not None]
    if known:
        prompt = sum(v.prompt_tokens or 0 for v in known)
        output = sum(v.output_tokens for v in known)
        words += (
            f" {its.capitalize()} {fmt.count(prompt, 'prompt token')} and "
            f"{fmt.count(output, 'output token')} "
            f"are recomputed when {'it runs' if one else 'they run'} again."
        )
    cost = p.cost
    if cost is not None:
        redo = (
            f", {fmt.count(cost.recomputed_tokens, 'token')} recomputed in "
            f"{fmt.count(cost.recompute_steps, 'step')} ({fmt.ms(cost.recompute_s)})"
            if cost.recomputed_tokens
            else ""
        )
        words += f" Cost: next token {fmt.ms(cost.waited_s)} later{redo}."
    return words
