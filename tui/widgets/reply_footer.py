"""A reply's footer: its fields (TTFT, ITL, tokens/s, how it ended) and its TTFT split,
drawn as a SumLine of terms."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from engine.stats import percentile
from tui import format as fmt
from tui.telemetry.token_explainer import anatomy_parts
from tui.widgets.field_line import SEPARATOR, FieldLine, pack

if TYPE_CHECKING:
    from textual.geometry import Size

    from engine.events import RequestFinished

REASONS = {"stop": "done", "length": "hit max tokens", "abort": "stopped"}


def footer_fields(ev: RequestFinished) -> tuple[str, ...]:
    """TTFT, median and p99 ITL, tokens/s, prompt and output tokens, how it ended, and in
    a fleet where its prefix was and which replica served it."""
    itl = list(ev.itl_s)
    itl_part = (
        f"ITL p50 {fmt.ms(percentile(itl, 50))} · p99 {fmt.ms(percentile(itl, 99))}"
        if itl
        else "ITL –"
    )
    rate = ev.output_tokens / ev.e2e_s if ev.e2e_s > 0 else 0.0
    fields = [
        f"TTFT {fmt.ms(ev.ttft_s)}",
        itl_part,
        f"{rate:,.1f} tok/s",
        f"prompt {ev.prompt_tokens:,} · output {fmt.count(ev.output_tokens, 'token')}",
        REASONS.get(ev.reason, ev.reason),
    ]
    if ev.cached_prompt_tokens:
        cached, prompt = ev.cached_prompt_tokens, ev.prompt_tokens
        fields.append(f"cached {cached:,} of {prompt:,} prompt tokens (prefix cache)")
    if ev.preemptions:
        fields.append(f"preempted ×{ev.preemptions}")
    if ev.fleet is not None:
        # Where in the fleet it ran, and where its prefix was (engine/fleet's words).
        fields.extend(ev.fleet.words())
    if ev.handoff is not None:
        fields.append(ev.handoff.words())
    return tuple(fields)


def footer_line(ev: RequestFinished) -> str:
    return SEPARATOR.join(footer_fields(ev))


def anatomy_fields(ev: RequestFinished) -> tuple[str, ...]:
    """Where the TTFT went, as the terms of one sum, when the engine measured it step by
    step, or a disaggregated request's two servers timed it; () otherwise (a remote
    server, or no token came)."""
    if ev.handoff is not None and ev.ttft_s is not None:
        return tuple(f"{name} {fmt.ms(seconds)}" for name, seconds in ev.handoff.parts())
    if ev.anatomy is None or ev.ttft_s is None:
        return ()
    return anatomy_parts(ev.anatomy, ev.ttft_s)


PLUS = " + "


class SumLine(FieldLine):
    """A FieldLine of terms: "a + b + c", wrapped between terms, never inside one; a
    wrapped line starts with "+ " so it still reads as the same sum."""

    @property
    def plain(self) -> str:
        return PLUS.join(self.fields)

    def _lines(self, width: int) -> list[str]:
        lines = pack(self.fields, max(1, width - 2), PLUS)
        return [line if i == 0 else "+ " + line for i, line in enumerate(lines)]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width)) if self.fields else 0

    def render(self) -> Text:
        return Text("\n".join(self._lines(self.content_size.width)), end="")
