"""HelpScreen: every key binding, and what each panel shows."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static

from tui.screens.main import MainScreen
from tui.screens.replay import ReplayScreen
from tui.widgets.count_stepper import CountStepper
from tui.widgets.latency_box import LatencyBox
from tui.widgets.prompt_length_slider import PromptLengthSlider

if TYPE_CHECKING:
    from collections.abc import Iterable

    from textual.app import ComposeResult

PANELS_TEXT = """
## The panels

**Chat** (centre). Your conversation with the model. Each reply streams in token by token and
ends with a footer: time to first token (TTFT), median and p99 inter-token latency (ITL),
tokens per second, prompt and output tokens, and how it ended. With *latency colours* on,
every token is coloured by its own latency (green ≤ 1.5× the reply's median ITL, yellow
≤ 3×, red beyond; the first token, underlined, is the TTFT), so a stall shows where it
happened.

**Controls** (left). The model card: what was loaded and how big its KV cache is. Sampling
settings. The *prompt-length slider* sends a synthetic prompt of exactly N tokens (Enter in
an empty message box sends it; what you type is appended); its ruler marks the walls:
**M** `max_model_len` (a prompt of M tokens or more is refused), **K** the KV pool divided
by the concurrency, less each copy's max tokens of output (past it requests are preempted
or queued; just under it the ruler turns amber), and **G** the emulated GPU's pool when one
is emulated (its context limit is not emulated: M stays this model's). *Concurrency* sends
that many copies of each request at once, to fill the pool and provoke preemption; the
line under it says how many fit. A send that will prefill for long is estimated first,
from a fixed cost plus a per-token rate fitted to this session's prefills (a rough range
until two prompt lengths are measured; none for a prompt M refuses).
*Load* runs background traffic: that many users, each sending a synthetic prompt when its
last one ends (ctrl+t doubles them, ctrl+o stops them); every 10 s of it is one point on
the engine's *Load* plot, labelled with its users (●8), output tokens/s against median ITL,
the roofline's curve behind (or, past the measured range, the frame says it is off the
chart) and the knee marked where more users stopped paying.

**Engine** (right). Live, from the latest engine step, the same one for every part:
running and waiting requests, prefill and decode tokens of the step (and a warning when the
host is too busy for its timings to mean much), the *KV block map* (one character per
physical block, coloured by the request that holds it: █ held, ◘ held and found in the
prefix cache, ▪ freed but still cached (evictable, reused if a prompt starts the same), dim
dots empty), KV usage over
the last 60 s with preemptions marked, ITL per token of the current reply with p50/p90/p99,
and *latency vs prompt tokens* for every reply of the session: TTFT (•) grows with the
prompt, median ITL (×) stays flat. A copy that queued behind others is drawn as ◇, with its
queue time taken off; a reply measured while the host was busy is hollow and dim (○ TTFT,
+ ITL). F9 clears the plots; ctrl+y puts that plot on a log scale.

**Roofline** (F8, in the Engine column). Each engine step whose work the engine counted
(vLLM with `--enable-mfu-metrics`; the fake sets its own counts) is one point: x its
arithmetic intensity (FLOPs per byte it moved), y the FLOP/s it achieved, both on log
scales; ■ prefill, ● decode, ◆ both in one step; the last 5 s bright, older steps dim.
The steps of the reply the ITL plot follows (the latest you sent) are ◉, in their kind's
colour, and the title says which reply and how many of its steps it draws (◉ r3's 17 steps).
Under the slope a step is memory-bound: it waits on bytes, as decode does, reading every
weight for one token per request. Under the flat roof it is compute-bound, as a long
prompt's prefill is. The ridge is where the two roofs meet: more users move decode right,
towards it, because the batch shares the weight reads. No step can beat a roof: a point
above one (!) is a calibration problem, and the plot says so in words. In-process, the
line under the plot holds vLLM's count of each step to kvscope's own (the same scheduled
tokens through `roofline/`'s model): they agree within 2 %, or it names the first step
that does not. Attached to a server (`--url`) there are no steps: each point is one
*scrape window*, the growth of the server's `vllm:estimated_*` counters between two
/metrics scrapes; a server started without `--enable-mfu-metrics` counts nothing, and
the Server box says so.

**Roofline of a sweep** (F3, on the sweep screen). The shown mode's bench points take the
place of its plots, drawn as `kvscope roofline --plot` draws a saved bench JSON: an
in-process point as its prefill (■) and decode (●) parts, an attached one whole (◆), one
above a roof as !. A live run's points sit under this machine's roofs; a file loaded with
F9 (after the run began, or with no run) under the roofs it was measured against. A point
with no FLOP and byte counts is named, with why, in words. F3 again brings the usual
plots back.

**Latency anatomy.** A finished reply's footer splits its TTFT into queue, its own prefill
(and in how many chunks), others' work in those steps, and preemption, when the engine
measures them step by step. F6 turns the ITL plot into the *timeline*: one row per request,
time running right, each queued (░), prefilling a chunk (█), decoding (━) or preempted (╳);
the ruler ticks at every step and ▼ marks the reply's worst ITL. Idle stretches between
requests are cut to one column (┊). With that box focused, [ and ] (or ← →) move a cursor
over the reply's tokens, w jumps to the worst, and the line under the box names the reply
and says why that token waited: e.g. "r5: token 37 waited 412 ms: step 118 also ran a
2,048-token prefill chunk of r4". The timeline scrolls to that reply's row and keeps it in
view until ↑ ↓ scroll on; long IDs are cut to their distinct end ("…-1-61"). A remote
server shows no steps, so there the cause cannot be known.

A request's status reads: *submitted*, *queued by the scheduler (token budget)*, *waiting
for KV blocks* (only when fewer blocks are free than it needs), *prefilling (chunk k of
n)*, *decoding*, or *preempted*.

**Preemption in under two minutes** (`kvscope --fake`, or any engine): F7 turns the slider
on (512 tokens); F4, then Tab, focuses Concurrency, and → seven times makes it 8 copies
(the line under it says how many fit and how many will queue or preempt); F2, then Enter,
sends them. Within seconds the status line says "⚠ Step N preempted …", the block map
fills and the KV plot marks it. On a real engine's bigger pool, raise the slider (ctrl+↑)
until the line under Concurrency says "will queue or preempt".

Below 120 columns the panels become tabs: F2 Chat, F3 Engine, F4 Controls.

**Tapes.** Every session is recorded to a tape (the toast at start says where; `--no-tape`
turns it off). `kvscope replay TAPE` plays one back into these same panels, with no
engine: the bar under the panels says the step and whether it plays; Space pauses, ← →
step, Home End jump. `kvscope --resume` puts the last chat back, footers included, on a
fresh engine; a reply a crash cut short is marked interrupted.
"""

PREEMPTION_RECIPE_KEYS = ("F7", "F4, then Tab", "→ seven times", "F2, then Enter")
"""The recipe's keys, in order: the help and the README say them (a test presses them)."""

EXTRA_KEYS: tuple[tuple[str, str], ...] = (
    ("tab / shift+tab", "Move focus between controls"),
    ("enter", "Send the message (in the message box)"),
    ("ctrl+p", "Command palette: themes, sweep, help, …"),
    ("f5, then f4", "Sweep screen: prompt-length or load sweep"),
    ("ctrl+q", "Quit"),
)


# Textual's key names for keys a reader knows by their glyph.
KEY_GLYPHS = {
    "question_mark": "?",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
}


def binding_rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for item in bindings:
        if not isinstance(item, Binding):
            continue
        keys = " / ".join(KEY_GLYPHS.get(k.strip(), k.strip()) for k in item.key.split(","))
        # The tooltip where there is one: the footer's description is cut short to fit.
        rows.append((keys, item.tooltip or item.description or item.action))
    return rows


class HelpScreen(ModalScreen[None]):
    """A scrollable sheet of keys and panel meanings; any of Esc, F1, ? or q closes it."""

    CSS_PATH = "help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,f1,question_mark,q", "dismiss", "Close help"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog") as dialog:
            dialog.border_title = "kvscope help"
            dialog.border_subtitle = "Esc closes"
            with VerticalScroll(id="help-body"):
                yield Static(self._keys_table(), id="help-keys")
                yield Markdown(PANELS_TEXT, id="help-panels")
            yield Static("Esc, F1, ? or q closes this help", id="help-hint")

    def key_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        return [
            ("Anywhere", binding_rows(type(self.app).BINDINGS) + list(EXTRA_KEYS)),
            ("Main screen", binding_rows(MainScreen.BINDINGS)),
            ("Prompt-length slider (when focused)", binding_rows(PromptLengthSlider.BINDINGS)),
            ("Concurrency and Load (when focused)", binding_rows(CountStepper.BINDINGS)),
            ("ITL plot / timeline (when focused)", binding_rows(LatencyBox.BINDINGS)),
            ("Replay (kvscope replay TAPE)", binding_rows(ReplayScreen.replay_bindings())),
        ]

    def _keys_table(self) -> Group:
        key_style = self.app.theme_variables.get("accent", "bold")
        parts: list[Table | Text] = [Text("Keys", style="bold")]
        for title, rows in self.key_sections():
            table = Table(
                title=title, title_justify="left", box=box.SIMPLE_HEAD, expand=True, padding=(0, 1)
            )
            table.add_column("key", style=key_style, no_wrap=True, ratio=1)
            table.add_column("does", ratio=3)
            for key, what in rows:
                table.add_row(key, what)
            parts.append(table)
        return Group(*parts)
