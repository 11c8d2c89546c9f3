"""Comparisons: `--compare "FLAGS A" "FLAGS B"`, one sweep on two engine configs; and
`--compare-urls NAME=URL,NAME=URL`, one multi-turn chat run through each of two routers.

`--compare`: both configs run in this process, one after the other, with the engine
stopped and started again between them, so the only difference is the flags. The output:
both tables, then one table of B / A ratios per prompt length, and both configs overlaid
in the charts.

`--compare-urls`: a fleet's policy lives in its router, not in kvscope's flags, so the
configs are URLs (one router per policy, in front of the same replicas), attached in turn.
It is a flag of its own, not a form of `--compare`: `--compare` restarts an in-process
engine with each flag set and compares prompt-length sweeps; this attaches and runs chats.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from engine.errors import BadOption, KvscopeError
from engine.paths import write_private

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from bench.multi_turn import MultiTurnConfig, MultiTurnResult
    from bench.policy_compare import PolicyComparison
    from bench.sweep_result import SweepConfig, SweepResult
    from cli.result_files import ResultFile
    from engine.protocol import Engine
    from engine.remote.client import ServerUrl

    Measure = Callable[[Engine, MultiTurnConfig, str, str], MultiTurnResult]
    """One multi-turn run on a started engine, named (label) and with its URL."""

# A config that could not run, the other's results kept: the code `bench` exits with when
# some of its lengths failed (cli.bench imports this module, so it is not imported here).
EXIT_CONFIG_FAILED = 3

# (field, header): the figures the ratio table compares.
COMPARED = (
    ("mean_ttft_ms", "mean TTFT"),
    ("p99_ttft_ms", "p99 TTFT"),
    ("median_itl_ms", "median ITL"),
    ("p99_itl_ms", "p99 ITL"),
    ("output_throughput", "out tok/s"),
)


def parse_configs(pair: list[str]) -> list[tuple[str, list[str]]]:
    """[("A", flags), ("B", flags)] from the two quoted flag strings."""
    out = []
    for label, text in zip(("A", "B"), pair, strict=True):
        try:
            out.append((label, shlex.split(text)))
        except ValueError as exc:
            raise BadOption(f"--compare config {label}", f"{text!r}: {exc}") from exc
    return out


@dataclass
class Comparison:
    """What was measured of each config, and why a config after the first has no result."""

    results: dict[str, SweepResult]
    config: SweepConfig
    failed: dict[str, str] = field(default_factory=dict)  # label -> what stopped it


def run_compare(
    args: argparse.Namespace, config: SweepConfig, engine_argv: list[str]
) -> Comparison:
    """Measure each config on a fresh engine; a bad flag names the config it came from.

    A config that fails at engine start after A was measured (B's pool too small, say)
    does not throw A's sweep away: it is named in `failed`, and A is reported alone."""
    from bench.sweep_result import SweepResult
    from cli.engine_choice import started_engine
    from cli.measure import check_output_len, measure
    from engine.vllm.options import build_engine_settings

    configs = parse_configs(args.compare)
    # Both configs' flags are checked before either engine starts: a typo in B must not
    # cost the whole of A's sweep first.
    for label, flags in configs:
        try:
            build_engine_settings([*engine_argv, *flags], prepare=False)
        except KvscopeError as exc:
            raise BadOption(f"--compare config {label} ({' '.join(flags)})", exc.plain()) from exc
    out = Comparison({}, config)
    for label, flags in configs:
        argv = [*engine_argv, *flags]
        print(f"kvscope: config {label}: {' '.join(flags) or '(defaults)'}", file=sys.stderr)
        result = SweepResult(config, complete=False)
        try:
            with started_engine(
                args, argv, check=lambda ns: check_output_len(config, ns.max_model_len)
            ) as engine:
                measure(engine, config, result, [], hardware=None)
        except KvscopeError as exc:
            if not out.results:
                raise BadOption(
                    f"--compare config {label} ({' '.join(flags)})", exc.plain()
                ) from exc
            out.failed[label] = exc.plain().rstrip(".")
            continue
        out.results[label] = result
    return out


def ratio_table(results: dict[str, SweepResult], console: Console) -> None:
    a, b = results["A"], results["B"]
    table = Table(title="B / A, per prompt length (below 1: B is faster)", title_justify="left")
    table.add_column("prompt", justify="right")
    for _, header in COMPARED:
        table.add_column(header, justify="right")
    b_points = {p.prompt_len: p for p in b.points}
    for pa in a.points:
        pb = b_points.get(pa.prompt_len)
        cells = []
        for key, _ in COMPARED:
            va = pa.value(key)
            vb = pb.value(key) if pb is not None else None
            cells.append(f"{vb / va:.2f}x" if va and vb is not None else "-")
        table.add_row(f"{pa.prompt_len:,}", *cells)
    console.print(table)


def overlay_charts(results: dict[str, SweepResult], flags: list[str], width: int = 100) -> str:
    import plotext as plt

    out = []
    for key, title in (("mean_ttft_ms", "TTFT (ms)"), ("median_itl_ms", "median ITL (ms)")):
        plt.clf()
        plt.plotsize(width, 14)
        plt.theme("clear")
        for (label, result), marker, text in zip(
            results.items(), ("braille", "x"), flags, strict=True
        ):
            ok = [p for p in result.points if p.ok]
            plt.plot(
                [p.prompt_len for p in ok],
                [p.value(key) or 0.0 for p in ok],
                marker=marker,
                label=f"{label}: {text}",
            )
        plt.title(f"{title} vs prompt length, A and B")
        plt.ylim(0, None)
        out.append(plt.build())
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out))


def report_compare(done: Comparison, args: argparse.Namespace, json_path: str | None) -> int:
    """Both tables and the ratios; with a config that failed, what the other measured,
    on stdout and in the JSON, and one line naming the failure (exit 3, as a sweep
    with failed lengths)."""
    from bench.sweep_result import SweepResult
    from cli.launch import say
    from cli.sweep_table import render_summary

    results = done.results
    console = Console(file=sys.stdout, width=120)
    for label, text in zip(("A", "B"), args.compare, strict=True):
        console.print(f"[bold]config {label}[/]: {text or '(defaults)'}")
        if label in results:
            render_summary(results[label], console)
        else:
            console.print(f"  not measured: {done.failed[label]}", markup=False)
    if len(results) == 2:
        ratio_table(results, console)
        console.file.write(overlay_charts(results, list(args.compare)) + "\n")
    if json_path:
        configs: dict[str, Any] = {}
        for label, text in zip(("A", "B"), args.compare, strict=True):
            result = results.get(label) or SweepResult(done.config, complete=False)
            configs[label] = {"flags": text, **result.to_dict()}
            if label in done.failed:
                configs[label]["error"] = done.failed[label]
        write_private(Path(json_path), json.dumps({"compare": configs}, indent=2))
    for label, why in done.failed.items():
        kept = f"; config A's results are above{f' and in {json_path}' if json_path else ''}"
        say(f"config {label} ({_flags_of(args, label)}) could not run: {why}{kept}")
    return EXIT_CONFIG_FAILED if done.failed else 0


def _flags_of(args: argparse.Namespace, label: str) -> str:
    return str(args.compare["AB".index(label)]) or "(defaults)"


# -- `--compare-urls NAME=URL,...`: one multi-turn chat run through each router ------------------
MAX_COMPARED_URLS = 8
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{0,23}$")


def parse_compare_urls(text: str) -> list[tuple[str, ServerUrl]]:
    """[(name, url), ...] from `A=URL,B=URL` (unnamed ones are A, B, ... in order)."""
    from engine.fleet.replicas import empty_name, same_server
    from engine.remote.client import parse_server_url, safe_url

    option = "--compare-urls"
    items = [part.strip() for part in str(text).split(",") if part.strip()]
    if not 2 <= len(items) <= MAX_COMPARED_URLS:
        raise BadOption(
            option,
            f"{len(items)} URL(s) given; compare 2 to {MAX_COMPARED_URLS}, e.g. "
            "round_robin=http://127.0.0.1:8080,cache_aware=http://127.0.0.1:8081",
        )
    out: list[tuple[str, ServerUrl]] = []
    for i, item in enumerate(items):
        name, eq, rest = item.partition("=")
        if eq and not name.strip():
            raise BadOption(option, empty_name(item))
        if eq and _NAME.match(name.strip()):
            name, url_text = name.strip(), rest.strip()
        elif eq and name.strip() and not any(c in name for c in ":/?#@"):
            raise BadOption(
                option,
                f"{name.strip()!r} is not a name: use a letter, then up to 23 letters, digits, "
                "'.', '_', '+' or '-' (e.g. cache_aware=http://127.0.0.1:8081)",
            )
        else:
            name, url_text = "ABCDEFGH"[i], item
        try:
            url = parse_server_url(url_text)
        except BadOption as exc:
            raise BadOption(option, f"{safe_url(url_text)!r}: {exc.reason}") from None
        if any(name == seen for seen, _ in out):
            raise BadOption(option, f"two URLs are named {name!r}; give each its own name")
        twin = next(((n, u) for n, u in out if same_server(u.root, url.root)), None)
        if twin is not None:
            # One server through two names would run the same chats twice and call the
            # difference between the runs a difference between routing policies.
            raise BadOption(
                option,
                f"{twin[0]}={twin[1].root} and {name}={url.root} are one server (the same "
                "port on the same host): compare two routers, each at its own address",
            )
        out.append((name, url))
    return out


def run_compare_urls(
    args: argparse.Namespace,
    config: MultiTurnConfig,
    engine_argv: list[str],
    files: list[ResultFile],
    measure: Measure,
) -> PolicyComparison:
    """The same chats (each run its own sessions) through each URL, one after the other,
    each run by `measure` on its attached engine; the files written after each URL.

    A URL that cannot be attached after another was measured does not throw that run away:
    it is named in `failed`, and the others are reported."""
    import argparse as _argparse

    from bench.policy_compare import PolicyComparison
    from cli.engine_choice import started_engine

    urls = parse_compare_urls(args.compare_urls)
    for flag, given in (("--url", args.url), ("--fake", args.fake), ("--tape", args.tape)):
        if given:
            raise BadOption("--compare-urls", f"it attaches to each URL in turn: not with {flag}")
    if engine_argv:
        raise BadOption(
            " ".join(engine_argv[:3]),
            "vLLM engine flags belong to the servers behind --compare-urls, not to kvscope",
        )
    for f in files:
        f.check()
    out = PolicyComparison(config, {name: url.root for name, url in urls})
    for name, url in urls:
        print(f"kvscope: {name}: {url.root}", file=sys.stderr)
        one = _argparse.Namespace(**{**vars(args), "url": url})
        try:
            with started_engine(one, []) as engine:
                card = engine.card
                config.check_fits(card.max_model_len if card else None)
                out.results[name] = measure(engine, config, name, url.root)
        except KvscopeError as exc:
            if not out.results:
                raise BadOption(f"--compare-urls {name} ({url.root})", exc.plain()) from exc
            out.failed[name] = exc.plain().rstrip(".")
        for f in files:
            f.write(out)  # after every URL: a stopped comparison keeps what it measured
    return out


def report_compare_urls(done: PolicyComparison, files: list[ResultFile]) -> int:
    """The table and what it shows; a URL that failed named in one line (exit 3)."""
    from cli.launch import say
    from cli.load_table import render_policy_compare
    from cli.result_files import say_problems

    render_policy_compare(done, Console(file=sys.stdout, width=160))
    say_problems(files)
    for name, why in done.failed.items():
        say(f"{name} ({done.urls[name]}) could not run: {why}; the others are above")
    failed_turns = [r for r in done.results.values() if r.failed]
    for r in failed_turns:
        say(f"{r.label}: {r.failed} of {len(r.records)} turns failed: {r.first_error}")
    return EXIT_CONFIG_FAILED if done.failed or failed_turns else 0
