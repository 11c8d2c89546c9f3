"""A Footer that does not keep every key it ever showed."""

from __future__ import annotations

from textual.widgets import Footer


class PrunedFooter(Footer):
    """Textual's Footer, without its leak (Textual 8.2.8).

    Each recompose (the bindings change at every reply's start and end) makes new
    FooterKeys bound to `Footer.compact`. Textual drops a closed key's watcher only when
    `compact` changes, which here it never does, so every key ever shown stayed alive:
    about 24 widgets a reply, a third of a MiB (measured over a 30-reply session).
    """

    async def recompose(self) -> None:
        await super().recompose()
        # The watcher lists live under this literal name (textual/reactive.py `_watch`).
        watchers: dict[str, list[tuple[object, object]]] = getattr(self, "__watchers", {})
        for entries in watchers.values():
            entries[:] = [
                (node, callback)
                for node, callback in entries
                if not getattr(node, "_closing", False)
            ]
