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
from tui_helpers import WIDE, engine_ready, make_app, reply_done, send_chat, settle, wait_until

from cli.attach import add_attach_args, check_replicas
from engine.errors import BadOption
from engine.fleet.fleet_engine import FleetEngine
from engine.fleet.replicas import parse_replicas
from engine.fleet.round_robin import RoundRobinEngine
from engine.remote import RemoteEngine
from tui.widgets.fleet_view import FleetView
from tui.widgets.reply_block import ReplyBlock

SCRAPE_S = 0.05  # the fleet's scrape interval in the app tests


def _args(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_attach_args(p)
    return p.parse_args(list(flags))


def test_replica_flags_are_refused_in_words_before_anything_starts() -> None:
    twice = ["--replica", "a=http://127.0.0.1:1", "--replica", "a=http://127.0.0.1:2"]
    with pytest.raises(BadOption, match="two replicas are named 'a'"):
        check_replicas(_args("--url", "http://127.0.0.1:9", *twice))
    with pytest.raises(BadOption, match="'c' is no --replica"):
        check_replicas(
            _args(
                "--url", "http://127.0.0.1:9", "--replica", "a=http://127.0.0.1:1",
                "--replica-kv-events", "c=tcp://127.0.0.1:5557",
            )
        )  # fmt: skip
    with pytest.raises(BadOption, match="no ZMQ endpoint"):
        check_replicas(
            _args(
                "--replica", "a=http://127.0.0.1:1", "--replica-kv-events", "a=http://x:1",
            )
        )  # fmt: skip
    with pytest.raises(BadOption, match="needs --url"):
        check_replicas(
            _args("--replica", "http://127.0.0.1:1", "--router-metrics", "http://127.0.0.1:2")
        )
    with pytest.raises(BadOption, match="needs --replica"):
        check_replicas(_args("--replica-kv-events", "a=off"))
    check_replicas(_args("--url", "http://127.0.0.1:9"))  # no replicas: nothing to check


def test_replicas_without_a_url_are_a_round_robin_from_the_first() -> None:
    args = _args("--replica", "a=http://127.0.0.1:1", "--replica", "b=http://127.0.0.1:2")
    check_replicas(args)
    assert args.round_robin and args.url.root == "http://127.0.0.1:1"


def test_generate_against_replicas_that_do_not_answer_is_one_line() -> None:
    import subprocess

    out = subprocess.run(
        [KVSCOPE, "generate", "--replica", "http://127.0.0.1:1", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "127.0.0.1:1" in one_line(out.stderr), out.stderr


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
            interval_s=SCRAPE_S,
        )
        app = make_app(engine=fleet)
        async with app.run_test(size=WIDE) as pilot:
            await engine_ready(pilot, quiet=False)  # the fleet view scrapes on
            view = app.main_screen.query_one(FleetView)
            await wait_until(
                pilot,
                lambda: view.state is not None and view.state.up == 2,
                timeout=20,
                what="both replicas scraped",
            )
            await settle(pilot, quiet=False)
            assert view.display
            console = Console(width=150, record=True)
            console.print(view.render())
            shown = console.export_text()
            assert "fleet: 2 replicas, 2 serving" in shown
            # One row each, with what each replica's own /metrics said.
            row_a = next(line for line in shown.splitlines() if line.strip().startswith("a "))
            assert " 3 " in row_a and " 5 " in row_a, row_a
        # Each replica's own /metrics was read, never through the router: it forwards
        # them to any worker, and counts them as requests.
        assert "/metrics" in a.paths() and "/metrics" in b.paths()
        assert "/metrics" not in router.paths()
        fleet.shutdown()  # as the CLI does after the app: the scrapers, then the streams
        assert fleet._scrapers is None
        seen = len(a.paths())
        # Nothing can be waited for here: an absence is checked. Six scrape intervals
        # are six chances for a scraper that outlived the fleet to show itself.
        await asyncio.sleep(6 * SCRAPE_S)
        assert len(a.paths()) == seen, "a scraper outlived the fleet"


async def test_round_robin_in_the_app_alternates_and_each_footer_says_where() -> None:
    """`kvscope --replica a=... --replica b=...` (no --url): the playground's wiring."""
    with FakeReplica("a") as a, FakeReplica("b") as b:
        replicas = parse_replicas([f"a={a.url}", f"b={b.url}"])
        inner = RoundRobinEngine([(r.name, RemoteEngine(r.where)) for r in replicas])
        fleet = FleetEngine(inner, replicas, interval_s=0.05)
        app = make_app(engine=fleet)
        async with app.run_test(size=WIDE) as pilot:
            await engine_ready(pilot, quiet=False)  # the fleet view scrapes on
            for text in ("one", "two"):
                await send_chat(pilot, text)
                await reply_done(pilot, quiet=False)
            footers = [r.footer_text for r in app.main_screen.query(ReplyBlock)]
            assert footers[0].endswith("served by a (kvscope's round robin)"), footers
            assert footers[1].endswith("served by b (kvscope's round robin)"), footers
            view = app.main_screen.query_one(FleetView)
            await wait_until(pilot, lambda: view.state is not None, timeout=20, what="rows")
            assert view.state is not None and "round robin over a, b" in view.state.routing
        fleet.shutdown()
