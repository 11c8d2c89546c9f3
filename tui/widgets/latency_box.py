"""LatencyBox: the engine panel's box around the ITL plot. It shows either the ITL plot or
the request timeline (F6), and with keys moves a cursor over the selected reply's tokens,
naming why the token under it waited (see `Telemetry.explain_token`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static

from tui.widgets.box_titles import retitle
from tui.widgets.plot import Plot
from tui.widgets.request_timeline import KEY, RequestTimeline

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from tui.telemetry.buffers import Telemetry

TimelineMode = Literal["itl", "timeline"]


class LatencyBox(Vertical):
    """The ITL plot's box: the ITL plot or the request timeline, and the spike cursor.

    Compose it with the ITL `Plot` inside (`with LatencyBox(telemetry): yield Plot(...)`);
    it adds the timeline and the line that names the cause of the token under the cursor.
    Its owner calls `redraw()` from its redraw timer, after setting the ITL box's titles.
    """

    DEFAULT_CSS = """
    LatencyBox > #spike-line { display: none; height: auto; color: $text-secondary; }
    LatencyBox.-explained > #spike-line { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left_square_bracket,left", "move_cursor(-1)", "Previous token"),
        Binding("right_square_bracket,right", "move_cursor(1)", "Next token"),
        Binding("w", "worst_token", "Worst ITL"),
        Binding("up", "scroll_rows(1)", "Older requests", show=False),
        Binding("down", "scroll_rows(-1)", "Newer requests", show=False),
    ]
    can_focus = True

    mode: reactive[TimelineMode] = reactive[TimelineMode]("itl")
    """What the box shows: the ITL per token, or the timeline of every request."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.telemetry = telemetry
        self._kept_cursor: int | None = None
        self._spike_key: object = None  # what the spike line was last worded from
        self._spike_words = ""
        self._spike_request: str | None = None

    def compose(self) -> ComposeResult:
        timeline = RequestTimeline(self.telemetry, id="request-timeline")
        timeline.display = False
        yield timeline
        yield Static("", id="spike-line")

    @property
    def timeline(self) -> RequestTimeline:
        return self.query_one(RequestTimeline)

    @property
    def spike_text(self) -> str:
        """The line under the box, naming the cursor token's cause ("" when hidden).

        Once shown it stays when the focus moves on (to the chat, say), so a presenter
        can talk over it; it names its token, so it still reads without the cursor."""
        return self._spike_words if self.has_class("-explained") else ""

    def toggle(self) -> None:
        """Show the other view, and take the focus so the cursor keys work at once."""
        self.mode = "timeline" if self.mode == "itl" else "itl"
        self.focus()

    def watch_mode(self, mode: TimelineMode) -> None:
        for plot in self.query(Plot):
            plot.display = mode == "itl"
        self.timeline.display = mode == "timeline"
        # The ITL part of the owner's redraw sets this box's titles only when the ITL
        # changed: make it so, for the titles to be the ITL's again.
        self.telemetry.itl_version += 1
        self.redraw()

    def redraw(self) -> None:
        """Bring the timeline, the titles (in timeline mode) and the spike line up to date."""
        if not self.is_mounted:
            return
        if self.mode == "timeline":
            timeline = self.timeline
            if timeline.changed():
                timeline.refresh()
            retitle(self, timeline.layout_now().title, KEY)
        self._show_spike()

    def _show_spike(self) -> None:
        tel = self.telemetry
        timeline = self.timeline
        if timeline.follow is not None and timeline.follow != tel.itl_request:
            timeline.follow = None  # a new reply: the old one's row need not stay in view
        if not self.has_focus:
            # A kept line is about the reply it was worded for: a new one takes it away.
            if self._spike_request != tel.itl_request:
                self.remove_class("-explained")
            return
        # The words change with the cursor, and with new tokens and steps while streaming.
        key = (tel.cursor, len(tel.tokens), tel.tracked_finish is not None, tel.steps_version)
        if key == self._spike_key:
            return
        self._spike_key = key
        if tel.cursor is None:
            words = "no tokens of a reply yet: send a message, then [ and ] step through them"
        else:
            # Named: under load the timeline is mostly other requests' rows, and a line
            # about "token 4 of 53" read as one of theirs.
            words = tel.explain_token(tel.cursor)
            if tel.itl_request is not None:
                words = f"{tel.itl_request}: {words}"
                if self.mode == "timeline" and tel.timeline.row(tel.itl_request) is None:
                    kept = len(tel.timeline.rows)
                    words += f" (its row is older than the {kept:,} the timeline keeps)"
        self._spike_words = words
        self._spike_request = tel.itl_request
        self.query_one("#spike-line", Static).update(Text(words))
        self.add_class("-explained")

    def on_focus(self) -> None:
        tel = self.telemetry
        if tel.cursor is None:
            start = self._kept_cursor
            if start is None or start >= len(tel.tokens):
                start = tel.worst_token()
            if start is None and tel.tokens:
                start = len(tel.tokens) - 1
            tel.set_cursor(start)
        self._show_explained_row()
        self.redraw()

    def _show_explained_row(self) -> None:
        """Scroll the timeline to the row of the request the line explains, and keep it
        there as new rows come in (until the user scrolls on)."""
        self.timeline.follow = self.telemetry.itl_request

    def on_blur(self) -> None:
        # The cursor is shown only while the keys move it.
        self._kept_cursor = self.telemetry.cursor
        self.telemetry.set_cursor(None)
        self._spike_key = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "scroll_rows":
            # In the ITL view up and down scroll the panel, as anywhere else.
            return self.mode == "timeline"
        return True

    def action_move_cursor(self, delta: int) -> None:
        tel = self.telemetry
        if not tel.tokens:
            return
        start = tel.cursor if tel.cursor is not None else len(tel.tokens) - 1
        tel.set_cursor(start + delta)
        self._show_explained_row()
        self.redraw()

    def action_worst_token(self) -> None:
        self.telemetry.set_cursor(self.telemetry.worst_token())
        self._show_explained_row()
        self.redraw()

    def action_scroll_rows(self, delta: int) -> None:
        timeline = self.timeline
        # From the row shown now (the kept one's offset), then the user's to move.
        offset = timeline.layout_now().offset
        timeline.follow = None
        timeline.scroll_back = max(0, offset + delta)
        self.redraw()
