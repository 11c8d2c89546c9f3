"""The app's start changes no class that its widgets could have been composed with.

A class added or removed on a mounted widget restyles it and everything under it: the
screen's breakpoint class restyled every widget, the engine panel's `-not-ready` the whole
panel, and each footer key was made compact and then not. Composed with the class they
will have, they cost nothing at the start. Measured on a 2-core AVX-512 EPYC, 2026-12-07,
CPU time from `run_test` to the engine ready and the screen settled, four alternating
rounds of six starts: 0.89 s a start before, 0.61 s after (160x48: 0.98 -> 0.83 s; 80x24:
0.78 -> 0.41 s). Every UI test starts the app, so the suite saves that ~250 times.

Recorded here: every class change on a mounted widget from the app's start until the
engine is ready and the screen has settled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from textual.dom import DOMNode
from textual.widget import Widget
from tui_helpers import engine_ready, make_app

if TYPE_CHECKING:
    from collections.abc import Callable

Change = tuple[str, str]  # the widget's class name, the CSS class added (+) or removed (-)


@pytest.fixture
def class_changes(monkeypatch: pytest.MonkeyPatch) -> list[Change]:
    """Each class that changes on a mounted node, through any of Textual's three ways."""
    changes: list[Change] = []

    def recording(method: Callable[..., Any]) -> Callable[..., Any]:
        def changed(node: DOMNode, *args: Any, **kwargs: Any) -> Any:
            before = set(node.classes)
            result = method(node, *args, **kwargs)
            if isinstance(node, Widget) and node.is_mounted:  # restyled, not composed
                after = set(node.classes)
                name = type(node).__name__
                changes.extend((name, "+" + c) for c in sorted(after - before))
                changes.extend((name, "-" + c) for c in sorted(before - after))
            return result

        return changed

    for name in ("add_class", "remove_class", "update_classes"):
        monkeypatch.setattr(DOMNode, name, recording(getattr(DOMNode, name)))
    return changes


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_start_changes_no_class_that_could_have_been_composed(
    class_changes: list[Change], size: tuple[int, int]
) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await engine_ready(pilot)
        assert app.main_screen.has_class("-wide" if size[0] >= 120 else "-narrow")
    composable = {"-narrow", "-wide", "-compact", "-empty"}
    assert [c for c in class_changes if c[1][1:] in composable] == []
    # The engine panel stops being not ready once, and is never made so at its mount.
    assert [c for c in class_changes if c[1][1:] == "-not-ready"] == [
        ("EnginePanel", "--not-ready")
    ]
