"""A widget that shows a plotext figure at its own size, in the theme's colours."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.widget import Widget

from tui.plotting import RGB, Figure, Palette, PlotJob

if TYPE_CHECKING:
    from rich.style import Style

# Colour roles a figure may use, each a component class styled from theme variables in
# plot.tcss, so a theme change recolours the plots without any hex code in Python.
ROLES = ("axes", "series", "series-alt", "marker", "p50", "p90", "p99")


def _rgb(style: Style, fallback: RGB) -> RGB:
    if style.color is None:
        return fallback
    triplet = style.color.get_truecolor()
    return (triplet.red, triplet.green, triplet.blue)


class Plot(Widget):
    """Shows the last drawn figure; the owner decides when to draw (see `job`/`apply`).

    The widget never calls plotext itself: `job()` says what would be drawn, a
    `PlotRenderer` draws it (on the event loop), and `apply()` shows the result. `job()` returns
    None when nothing changed since the last draw (same data version, size and colours),
    which is how a redraw timer skips idle plots.
    """

    # Its own styles travel with it, so the widget works in any host app.
    DEFAULT_CSS = """
    /* Plot colours come from the theme: each role is a component class. */
    Plot {
        height: 1fr;
        min-height: 5;
        width: 1fr;
    }
    Plot > .plot--axes { color: $foreground-muted; }
    Plot > .plot--series { color: $primary; }
    Plot > .plot--series-alt { color: $accent; }
    Plot > .plot--marker { color: $error; }
    Plot > .plot--p50 { color: $success; }
    Plot > .plot--p90 { color: $warning; }
    Plot > .plot--p99 { color: $error; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"plot--{role}" for role in ROLES}

    def __init__(
        self,
        placeholder: str = "no data yet",
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.placeholder = placeholder
        self._figure: Figure | None = None
        self._version: object = None
        self._drawn_key: tuple[object, ...] | None = None
        self._text: Text | None = None

    @property
    def has_drawing(self) -> bool:
        return self._text is not None

    @property
    def has_figure(self) -> bool:
        """There is data to draw (the placeholder is not what the plot shows)."""
        return self._figure is not None

    def set_figure(self, figure: Figure | None, version: object) -> None:
        """Give the data to draw; `version` changes whenever the data does."""
        self._figure = figure
        self._version = version
        if figure is None and self._text is not None:
            self._text = None
            self._drawn_key = None
            self.refresh()

    def palette(self) -> Palette:
        fallback: RGB = (128, 128, 128)
        return tuple(
            (role, _rgb(self.get_component_rich_style(f"plot--{role}"), fallback)) for role in ROLES
        )

    def job(self) -> PlotJob | None:
        """What to draw now, or None when the visible drawing is already current."""
        if self._figure is None or not self.display:
            return None
        width, height = self.content_size
        if width < 10 or height < 4:
            return None
        palette = self.palette()
        key = (self._version, width, height, palette)
        if key == self._drawn_key:
            return None
        return PlotJob(key, self._figure, width, height, palette)

    def apply(self, job: PlotJob, ansi: str) -> None:
        self._drawn_key = job.key
        self._text = Text.from_ansi(ansi, no_wrap=True, end="")
        self.refresh()

    def render(self) -> Text:
        if self._text is None or self._figure is None:
            return Text(self.placeholder, style=self.get_component_rich_style("plot--axes"))
        return self._text
