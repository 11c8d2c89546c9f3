"""Attach to a fleet: requests through one URL (a router), each `--replica` scraped on its
own, the fleet view in the engine panel (issue #21, item 1)."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from cli_helpers import KVSCOPE, one_line
from fleet_fakes import FakeReplica, metrics_text
from remote_server import FakeServer
from rich.console import Console
from tui_helpers import WIDE, engine_ready, make_app, settle, wait_until

from cli.attach import add_attach_args, check_replicas
from engine.errors import BadOption
from engine.fleet.fleet_engine import FleetEngine
from engine.fleet.replicas import parse_replicas
from engine.remote import RemoteEngine
from tui.widgets.fleet_view import FleetView


def _args(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_attach_args(p)
    return p.parse_args(list(flags))


def test_replicas_without_a_url_or_twice_the_same_are_refused_before_anything_starts() -> None:
    with pytest.raises(BadOption, match="needs --url"):
        check_replicas(_args("--replica", "http://127.0.0.1:1"))
    twice = ["--replica", "a=http://127.0.0.1:1", "--replica", "a=http://127.0.0.1:2"]
    with pytest.raises(BadOption):
        check_replicas(_args("--url", "http://127.0.0.1:9", *twice))
    check_replicas(_args("--url", "http://127.0.0.1:9"))  # no replicas: nothing to check


def test_generate_with_a_replica_but_no_url_is_one_line() -> None:
    import subprocess

    out = subprocess.run(
        [KVSCOPE, "generate", "--replica", "http://127.0.0.1:1", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "--replica" in one_line(out.stderr) and "needs --url" in out.stderr


async def test_the_fleet_view_shows_every_replica_beside_the_routers_session() -> None:
    busy = metrics_text(running=3, waiting=5)
    with (
        FakeServer() as router,
        FakeReplica("a", busy) as a,
        FakeReplica("b", metrics_text(running=0, waiting=0)) as b,
    ):
        fleet = FleetEngine(
            RemoteEngine(router.url, kv_events=None),
            parse_replicas([f"a={a.url}", f"b={b.url}"]),
            interval_s=0.05,
        )
        app = make_app(engine=fleet)
        async with app.run_test(size=WIDE) as pilot:
            await engine_ready(pilot)
            view = app.main_screen.query_one(FleetView)
            await wait_until(
                pilot,
                lambda: view.state is not None and view.state.up == 2,
                timeout=20,
                what="both replicas scraped",
            )
            await settle(pilot)
            assert view.display
            console = Console(width=150, record=True)
            console.print(view.render())
            shown = console.export_text()
            assert "fleet: 2 replicas, 2 serving" in shown
            # One row each, with what each replica's own /metrics said.
            row_a = next(line for line in shown.splitlines() if line.strip().startswith("a "))
            assert " 3 " in row_a and " 5 " in row_a, row_a
        # Each replica's own /metrics was read, never through the router.
        assert "/metrics" in a.paths() and "/metrics" in b.paths()
        fleet.shutdown()  # as the CLI does after the app: the scrapers, then the streams
        assert fleet._scrapers is None
        seen = len(a.paths())
        await asyncio.sleep(0.3)
        assert len(a.paths()) == seen, "a scraper outlived the fleet"
