"""A Footer that does not keep every key it ever showed, and shows the app's keys first."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

if TYPE_CHECKING:
    from textual.app import ComposeResult


class PrunedFooter(Footer):
    """Textual's Footer, without its leak (Textual 8.2.8).

    Each recompose (the bindings change at every reply's start and end) makes new
    FooterKeys bound to `Footer.compact`. Textual drops a closed key's watcher only when
    `compact` changes, which here it never does, so every key ever shown stayed alive:
    about 24 widgets a reply, a third of a MiB (measured over a 30-reply session).

    Textual lists the focused widget's keys first and the app's last, and a narrow
    terminal cuts the row at its right edge: at 80x24 F1 (help, which lists every key) and
    F5 were the ones lost, and F8 (the roofline, off until asked for: a key nobody sees is
    a panel nobody finds). The keys of `LEADING_ACTIONS` go first, so they always show.
    """

    LEADING_ACTIONS: ClassVar[tuple[str, ...]] = ("help", "sweep", "toggle_roofline")
    """Actions whose keys lead the row, in this order."""

    def compose(self) -> ComposeResult:
        # No binding here has a group: Footer.compose yields every key, none is added to
        # a KeyGroup, so reordering what it yields reorders the row.
        parts = list(super().compose())
        for part in parts:
            if isinstance(part, FooterKey):
                # A FooterKey is made compact (its default) and then bound to the footer's
                # `compact`: two restyles of each key at each recompose. Given the value
                # and its class before it mounts, its watcher finds the class right. The
                # palette's key is the one Textual leaves unbound: it stays compact.
                if not part.has_class("-command-palette"):
                    part.set_reactive(FooterKey.compact, self.compact)
                part.set_class(part.compact, "-compact", update=False)

        def rank(part: object) -> int:
            if isinstance(part, FooterKey) and part.action in self.LEADING_ACTIONS:
                return self.LEADING_ACTIONS.index(part.action)
            return len(self.LEADING_ACTIONS)

        yield from sorted(parts, key=rank)

    _drawn: tuple[object, ...] | None = None
    """What the last recompose drew (`_keys_now`), or None before one."""

    def _keys_now(self) -> tuple[object, ...] | None:
        """What compose would draw now, as a value to compare: every shown binding's key,
        its label, action, description, state and tooltip, in the screen's order, and the
        palette's key; None while Textual has no bindings for the footer yet."""
        if not self._bindings_ready or not self.is_attached:
            return None
        shown = tuple(
            (b.key, self.app.get_key_display(b), b.action, b.description, on, tip, b.group)
            for (_, b, on, tip) in self.screen.active_bindings.values()
            if b.show
        )
        return (shown, self.show_command_palette, self.app.ENABLE_COMMAND_PALETTE)

    async def recompose(self) -> None:
        # Textual recomposes at every change of the bindings anywhere on the screen (focus
        # moving, a reply starting or ending), and most change nothing the footer shows:
        # then the keys stay, rather than ~10 new widgets styled again each time.
        drawn = self._keys_now()
        if drawn is not None and drawn == self._drawn:
            return
        self._drawn = drawn
        await super().recompose()
        # The watcher lists live under this literal name (textual/reactive.py `_watch`).
        watchers: dict[str, list[tuple[object, object]]] = getattr(self, "__watchers", {})
        for entries in watchers.values():
            entries[:] = [
                (node, callback)
                for node, callback in entries
                if not getattr(node, "_closing", False)
            ]
