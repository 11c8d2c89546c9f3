"""RemoteStateView: a running vLLM server's state, as far as a client can see it.

Shown in the engine panel when kvscope is attached with `--url`: one row per engine (a
data-parallel rank is a row), the server's own TTFT and ITL since attach, the prefix-cache
index rebuilt from KV events, coloured by chat, and one line for each thing a remote view
cannot show, instead of a panel of zeros.

Scrapes stop without a word when a server is stopped (SIGSTOP) or wedged: nothing comes to
say so. The view keeps its own clock and, past STALE_AFTER_S with no scrape, says the
server does not answer, however the last scrape left it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui import format as fmt
from tui.roofline_figure import MFU_FLAG

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import HistogramDelta, PrefixCacheView, RemoteCapabilities, ScrapeSample

STALE_AFTER_S = 10.0
"""No scrape for this long: the panel says the server does not answer."""

COUNTS_MISSING_WORDS = f"no FLOP counts: serve with {MFU_FLAG} (F8)"
"""Said once the server ran tokens in a scrape window and its vllm:estimated_* counters
did not grow (absent, or exported at zero without the flag): the roofline (F8) has no
point without them. One line at 160x48, where the box is 58 columns wide."""


def _hist(h: HistogramDelta) -> str:
    """p50 / p99 of a server histogram since attach, or a dash before any observation."""
    if not h.count:
        return "–"
    return f"p50 {fmt.ms(h.quantile(0.5))} · p99 {fmt.ms(h.quantile(0.99))} ({h.count:,})"


def _occupancy(sample: ScrapeSample, width: int) -> Text:
    """How full the pool is, as a bar: the server says how many blocks, never which."""
    label = (
        f" {sample.kv_usage:.0%} of {sample.total_blocks:,} blocks "
        f"× {sample.block_size} tok (which blocks: not sent by the server)"
    )
    bar_width = max(10, min(40, width - len(label) - 2))
    filled = round(sample.kv_usage * bar_width)
    return Text.assemble(("█" * filled, "bold"), ("·" * (bar_width - filled), "dim"), label)


class RemoteStateView(Widget):
    """The attached server's engines, latencies and prefix cache, from /metrics and KV
    events; it says plainly what it cannot see."""

    DEFAULT_CSS = """
    RemoteStateView {
        height: auto;
    }
    RemoteStateView > .remote-state--label {
        color: $text-muted;
    }
    RemoteStateView > .remote-state--muted {
        color: $text-muted;
        text-style: italic;
    }
    RemoteStateView > .remote-state--warning {
        color: $warning;
    }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "remote-state--label",
        "remote-state--muted",
        "remote-state--warning",
    }

    sample: reactive[ScrapeSample | None] = reactive(None, layout=True)
    """The latest /metrics scrape, or None before the first."""
    capabilities: reactive[RemoteCapabilities | None] = reactive(None, layout=True)
    """What the remote engine can show right now."""
    cache: reactive[PrefixCacheView | None] = reactive(None, layout=True)
    """The prefix-cache index from KV events."""
    stale_s: reactive[int | None] = reactive(None, layout=True)
    """Whole seconds since the last scrape once past STALE_AFTER_S, else None."""

    clock: Callable[[], float] = staticmethod(time.monotonic)
    """The view's own clock for `stale_s` (a test sets a fake one)."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._last_news: float | None = None  # when a scrape (or the first caps) came
        # Whether the server ran tokens and counted no FLOPs (its MFU flag is off): kept
        # from such a window until one is counted, so idle windows do not hide it.
        self._counts_missing = False

    def on_mount(self) -> None:
        self.set_interval(1.0, self.check_stale)

    def watch_sample(self, sample: ScrapeSample | None) -> None:
        if sample is not None:
            self._last_news = self.clock()
            self.stale_s = None
            if sample.perf is not None:
                self._counts_missing = False
            elif sample.prompt_tokens or sample.generation_tokens:
                self._counts_missing = True

    def watch_capabilities(self, caps: RemoteCapabilities | None) -> None:
        if caps is not None and self._last_news is None:
            self._last_news = self.clock()  # attached: the wait for a first scrape starts

    def check_stale(self) -> None:
        """Say so once no scrape came for STALE_AFTER_S (called every second)."""
        caps = self.capabilities
        if self._last_news is None or caps is None or not caps.metrics:
            return  # no metrics at all is said otherwise (metrics_note), not as silence
        age = self.clock() - self._last_news
        self.stale_s = int(age) if age >= STALE_AFTER_S else None

    def render(self) -> RenderableType:
        style = self.get_component_rich_style
        caps = self.capabilities
        parts: list[RenderableType] = []
        if caps is not None:
            head = f"attached to {caps.url}"
            if self.stale_s is not None:
                parts.append(
                    Text(
                        f"{head}: the server does not answer (no scrape for {self.stale_s} s)",
                        style("remote-state--warning"),
                    )
                )
            elif not caps.reachable:
                parts.append(
                    Text(f"{head}: the server does not answer", style("remote-state--warning"))
                )
            else:
                parts.append(Text(head, style("remote-state--label")))
            if caps.metrics_note:
                # Why metrics are missing, or what was dropped of them (bad samples).
                parts.append(Text(caps.metrics_note, style("remote-state--warning")))
        sample = self.sample
        if sample is not None and sample.total_blocks:
            parts.append(_occupancy(sample, self.size.width or 40))
        if sample is not None and sample.rows:
            table = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
            # Short headers: the panel is 40-70 columns wide.
            for name in ("rank", "run", "wait", "KV", "pre", "hits", "in/s", "out/s"):
                table.add_column(name, justify="left" if name == "rank" else "right", no_wrap=True)
            for row in sample.rows:
                table.add_row(
                    row.engine,
                    str(row.running),
                    fmt.waiting(row.waiting_by_reason, row.waiting),
                    f"{row.kv_usage:.0%}",
                    str(row.preemptions),
                    fmt.percent(row.prefix_cache_hit_rate),
                    f"{row.prompt_tokens_per_s:,.0f}",
                    f"{row.generation_tokens_per_s:,.0f}",
                )
            parts.append(table)
            parts.append(
                Text.assemble(("server TTFT ", style("remote-state--label")), _hist(sample.ttft))
            )
            parts.append(
                Text.assemble(("server ITL  ", style("remote-state--label")), _hist(sample.itl))
            )
        if self._counts_missing:
            parts.append(Text(COUNTS_MISSING_WORDS, style("remote-state--warning")))
        cache = self.cache
        if cache is not None:
            if cache.receiving:
                sessions = cache.by_session()
                who = ", ".join(f"{s or '?'}: {n}" for s, n in sorted(sessions.items(), key=str))
                parts.append(
                    Text.assemble(
                        ("prefix cache ", style("remote-state--label")),
                        f"{len(cache.blocks):,} blocks cached ({who}); "
                        f"{cache.reused_total:,} re-used, {cache.removed_total:,} evicted",
                    )
                )
            if cache.note:
                parts.append(Text(cache.note, style("remote-state--muted")))
        if caps is not None:
            for note in caps.notes:
                parts.append(Text(note, style("remote-state--muted")))
        if not parts:
            return Text(
                "waiting for the server's first /metrics scrape…", style("remote-state--muted")
            )
        return Group(*parts)
