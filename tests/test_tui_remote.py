"""The playground attached to a server: what the engine panel shows, and what it says it
cannot show. Driven by /metrics text and KV events recorded from a real vLLM 0.32 server
(tests/fixtures/remote/record.py), parsed by the remote engine's own code; the chat runs on
the FakeEngine so the picture is deterministic.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rich.console import Console
from tui_helpers import engine_ready, make_app, settle

from engine.events import PrefixCacheView, RemoteCapabilities, ScrapeSample, StepSample
from engine.fake import FakeEngine
from engine.features import EngineFeatures
from engine.listeners import Listeners
from engine.remote.kv_event_wire import decode_batch
from engine.remote.metrics import ScrapeState, cache_info, parse_metrics, step_sample
from engine.remote.prefix_cache_index import PrefixCacheIndex
from tui.app import KvscopeApp
from tui.widgets.kv_block_map import KvBlockMap
from tui.widgets.remote_state import RemoteStateView

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.pilot import Pilot

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "remote"
SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


def recorded_scrapes() -> list[ScrapeSample]:
    texts = [(FIXTURES / f"metrics_{n}.txt").read_text() for n in ("idle", "busy")]
    parsed = [parse_metrics(t) for t in texts]
    info = cache_info(parsed[1])
    assert info is not None
    state = ScrapeState()
    return [state.update(p, 100.0 + 0.2 * i, info) for i, p in enumerate(parsed)]


def recorded_cache() -> PrefixCacheView:
    import base64

    index = PrefixCacheIndex()
    for line in (FIXTURES / "kv_events.jsonl").read_text().splitlines():
        record = json.loads(line)
        index.apply(decode_batch(base64.b64decode(record["payload_b64"])), 0, time.perf_counter())
    return index.view(replayed=0, missed=0, receiving=True, note="")


class RecordedServer(FakeEngine):
    """The FakeEngine for the chat, with a remote engine's extra surface fed from the
    recorded server: scrapes, capabilities and the prefix-cache index."""

    def __init__(self) -> None:
        super().__init__()
        self._capabilities = RemoteCapabilities(
            url="http://127.0.0.1:8000",
            reachable=True,
            metrics=True,
            metrics_note="",
            kv_events=True,
            kv_events_note="",
            server_timings=True,
            notes=("Step boundaries are not visible remotely: samples are /metrics scrapes.",),
        )
        self._scrapes: Listeners[ScrapeSample] = Listeners()
        self.sessions: list[str] = ["chat-a"]

    @property
    def features(self) -> EngineFeatures:
        return EngineFeatures(exact_steps=False, clock=self.clock, remote=self)

    @property
    def capabilities(self) -> RemoteCapabilities:
        return self._capabilities

    def add_scrape_listener(self, listener: Callable[[ScrapeSample], None]) -> Callable[[], None]:
        return self._scrapes.add(listener)

    def prefix_cache(self) -> PrefixCacheView:
        return recorded_cache()

    def new_session(self, session_id: str | None = None) -> str:
        self.sessions.append(session_id or f"chat-{len(self.sessions)}")
        return self.sessions[-1]

    def play(self) -> None:
        for scrape in recorded_scrapes():
            self._scrapes.emit(scrape)
            self._listeners.emit(step_sample(scrape))


async def _attached(pilot: Pilot[int]) -> None:
    await engine_ready(pilot)
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    engine = app.engine
    assert isinstance(engine, RecordedServer)
    engine.play()
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, KvscopeApp)
    await app.main_screen.redraw()
    if app.size.width < 120:
        await pilot.press("f3")
    await settle(pilot)


@pytest.mark.parametrize("size", SIZES)
def test_remote_layout(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(make_app(engine=RecordedServer()), terminal_size=size, run_before=_attached)


async def test_the_panel_shows_the_servers_state_and_no_block_ids() -> None:
    app = make_app(engine=RecordedServer())
    async with app.run_test(size=(160, 48)) as pilot:
        await _attached(pilot)
        view = app.main_screen.engine_panel.remote_state
        assert isinstance(view, RemoteStateView)
        assert view.display
        blocks_box = app.main_screen.query_one(KvBlockMap).parent
        assert blocks_box is not None
        assert not blocks_box.display
        sample = view.sample
        assert sample is not None
        assert sample.running == 1
        assert sample.used_blocks == 29
        console = Console(record=True, width=120, file=io.StringIO())
        console.print(view.render())
        text = console.export_text()
        assert "not sent by the server" in text
        assert "chat-a: 8" in text
        assert "synthetic-b: 30" in text
        step = app.main_screen.engine_panel.query_one("#engine-step")
        assert "scrape" in str(step.render())
        latest = app.main_screen.telemetry.latest
        assert isinstance(latest, StepSample)
        assert latest.blocks == ()


async def test_a_new_chat_starts_a_new_session() -> None:
    engine = RecordedServer()
    app = make_app(engine=engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot)
        await app.main_screen.action_new_chat()
        assert engine.sessions == ["chat-a", "chat-1"]
