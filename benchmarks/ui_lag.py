"""How much does a fast token stream cost the UI? A headless run of the real app.

The app runs headless (`App.run_test`: the compositor still lays out and renders every
frame; only the write to a terminal is skipped) around a FakeEngine on a real clock, tuned
to stream about 2,000 tokens/s: 16 concurrent copies of one long reply, a 6 ms decode
step. The fake runs in the app's process, so the rate it reaches depends on what the UI
leaves it: the run prints the rate it measured (`--step-ms 4` streams about 2,700).
While it streams, a probe coroutine sleeps 10 ms again and again and records how late it
wakes up: that is the event-loop lag a user would feel as sluggish keys. Memory is the
process RSS (and Python's own allocations, via tracemalloc's counters) at 5 s and at the end.

    python benchmarks/ui_lag.py            # 20 s, 16 copies of a 6 ms decode step
    python benchmarks/ui_lag.py --seconds 10 --copies 4
    python benchmarks/ui_lag.py --no-gc-freeze   # without run_tui's GC policy
    python benchmarks/ui_lag.py --profile /tmp/ui.prof --seconds 10   # cProfile the stream
    python benchmarks/ui_lag.py --long     # 200 replies, 100,000 tokens: memory over a session
    python benchmarks/ui_lag.py --gpu-scale   # 256 copies of 4,096 tokens, 100,000 blocks
    python benchmarks/ui_lag.py --gpu-scale --roofline   # with the roofline panel (F8) on

Targets: p99 lag < 16 ms (one frame at 60 fps) at about 2,000 tokens/s, memory flat (RSS
growth from 5 s to the end < 20 MiB: ring buffers are bounded; what grows is the
streaming reply, which keeps every token it shows, and garbage frozen by the GC policy
until the reply ends).

The long mode is a session rather than one reply: 200 replies of 500 tokens, one after
the other, as fast as one copy streams (a 0.5 ms step asks for 2,000 tokens/s; asyncio's
1 ms timer resolution and the frames make it 250-450 here). RSS must grow by less than
50 MiB from the end of the first 10 replies to the end of the last; that is what finished
replies cost once they are folded into static text (tui/widgets/reply_block.py `fold`).
Its lag figure includes the pauses between replies (folding, collecting garbage). The
chat history the model is sent is cleared before each send (100,000 tokens of it would
not fit the fake's context, and it is a few hundred KiB of strings, not the transcript's
cost).

The GPU-scale mode is the block map's worst case: a pool of 100,000 blocks drawn at
"1 char = N blocks", 256 requests of a 4,096-token prompt each holding 256+ blocks, a
decode step of 25 ms (an H200's, for a 7B model at that batch), so 10,000 tokens/s reach
the UI. Its figure is the same p99 lag, against the same target. `--roofline` turns the
roofline panel on first (F8, as a user does), so every step is also a point under the roofs
(the fake's steps carry FLOP and byte counts from its analytic model).

The screen is 160x48, the three-column layout: the largest area to repaint. Every run
prints how busy the (shared) host was meanwhile: compare rounds only at similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import HostLoad
from engine.clock import RealClock
from engine.fake import FakeConfig, FakeEngine
from engine.stats import percentile
from tui.app import KvscopeApp
from tui.settings import AppSettings

LAG_TARGET_MS = 16.0
MEMORY_TARGET_MIB = 20.0
LONG_MEMORY_TARGET_MIB = 50.0
PROBE_S = 0.010
SIZE = (160, 48)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def reply_words(n: int) -> tuple[str, ...]:
    # Real replies have paragraphs; a new one every 60 words keeps Markdown blocks small.
    return tuple(f"w{i}" + ("\n\n" if i % 60 == 59 else "") for i in range(n))


async def probe(lags_ms: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(PROBE_S)
        lags_ms.append((loop.time() - start - PROBE_S) * 1000.0)


def make_app(config: FakeConfig, manage_gc: bool) -> tuple[KvscopeApp, FakeEngine]:
    engine = FakeEngine(config, clock=RealClock())
    settings = AppSettings(folder=Path(tempfile.mkdtemp(prefix="kvscope-bench-")))
    settings.cursor_blink = False
    app = KvscopeApp(engine, settings)
    app.manage_gc = manage_gc  # as run_tui does
    return app, engine


def print_profile(profiler: cProfile.Profile, path: str | None) -> None:
    """The profile's top entries by own time and by cumulative time (and the file)."""
    if path:
        profiler.dump_stats(path)
        print(f"  profile written to {path} (snakeviz or `python -m pstats` reads it)")
    stats = pstats.Stats(profiler).strip_dirs()
    for key in ("tottime", "cumulative"):
        print(f"\n  top 25 by {key}:")
        stats.sort_stats(key).print_stats(25)


async def run(
    seconds: float,
    copies: int,
    step_s: float,
    manage_gc: bool = True,
    profile: str | None = None,
    prompt_tokens: int = 0,
    pool_blocks: int = 0,
    roofline: bool = False,
) -> int:
    tokens_per_request = int(seconds / step_s * 1.5) + 100  # outlasts the run
    context = prompt_tokens + tokens_per_request + 256
    config = FakeConfig(
        max_model_len=context,
        total_blocks=max(pool_blocks, copies * context // 16 + 64),
        decode_step_s=step_s,
        decode_s_per_context_token=0.0,
        prefill_base_s=0.001,
        prefill_s_per_token=0.0,
        reply_words=reply_words(tokens_per_request),
    )
    app, engine = make_app(config, manage_gc)
    lags: list[float] = []
    stop = asyncio.Event()
    profiler = cProfile.Profile() if profile is not None else None
    async with app.run_test(size=SIZE) as pilot:
        main = app.main_screen
        while main.engine_state == "loading":
            await pilot.pause(0.05)
        main.controls.concurrency = copies
        main.controls.query_one("#max-tokens").value = str(tokens_per_request)  # type: ignore[attr-defined]
        if prompt_tokens:
            main.controls.slider.value = prompt_tokens
        if roofline:
            await pilot.press("f8")
            while not main.engine_panel.show_roofline:
                await pilot.pause(0.05)
        await pilot.pause(0.2)
        gc.collect()
        host = HostLoad().start()
        probe_task = asyncio.create_task(probe(lags, stop))
        t0 = time.perf_counter()
        await main.send("Stream as fast as you can.", synthetic=bool(prompt_tokens))
        reply = main.current
        assert reply is not None

        def delivered() -> int:
            return sum(c.received for c in reply.copies)

        await asyncio.sleep(5.0 - (time.perf_counter() - t0))
        rss_5, tokens_5, t_5 = rss_mib(), delivered(), time.perf_counter()
        blocks_5 = sys.getallocatedblocks()
        lag_5 = len(lags)
        if profiler is not None:
            profiler.enable()
        await asyncio.sleep(seconds - (time.perf_counter() - t0))
        if profiler is not None:
            profiler.disable()
        rss_end, tokens_end, t_end = rss_mib(), delivered(), time.perf_counter()
        latest = app.telemetry.latest
        held_end = latest.total_blocks - latest.free_blocks if latest is not None else 0
        block_map = main.engine_panel.block_map
        per_cell = block_map.blocks_per_cell(block_map.content_size.width)
        blocks_end = sys.getallocatedblocks()
        load = host.note()
        shown = len(reply.tokens)
        stop.set()
        await probe_task
        main.action_stop()
        while main.busy:
            await pilot.pause(0.05)
        engine.shutdown()

    steady = lags[lag_5:]
    rate = (tokens_end - tokens_5) / (t_end - t_5)
    p50, p99, worst = percentile(steady, 50), percentile(steady, 99), max(steady)
    growth = rss_end - rss_5
    gc_note = "heap frozen after start-up" if manage_gc else "GC untouched"
    print(
        f"kvscope UI lag benchmark: {copies} copies, decode step {step_s * 1000:.1f} ms, "
        f"{seconds:.0f} s, {gc_note}{', under cProfile' if profiler else ''}"
        f"{', roofline panel on' if roofline else ''}"
    )
    if prompt_tokens:
        print(
            f"  pool {config.total_blocks:,} blocks, {copies} prompts of {prompt_tokens:,} "
            f"tokens; the block map draws 1 char = {per_cell:,} blocks; "
            f"blocks held at the end: {held_end:,}"
        )
    print(f"  {load}")
    print(
        f"  tokens delivered to the UI : {tokens_end:,} ({rate:,.0f} tokens/s from 5 s to the end)"
    )
    print(f"  event-loop lag (10 ms probe, {len(steady)} samples after 5 s):")
    print(
        f"      p50 {p50:.2f} ms   p99 {p99:.2f} ms   max {worst:.2f} ms   "
        f"(target p99 < {LAG_TARGET_MS:.0f} ms)"
    )
    print(
        f"  lag over the whole run     : p99 {percentile(lags, 99):.2f} ms, max {max(lags):.2f} ms"
    )
    print(
        f"  RSS at 5 s {rss_5:.1f} MiB, at {seconds:.0f} s {rss_end:.1f} MiB: "
        f"growth {growth:+.1f} MiB (target < {MEMORY_TARGET_MIB:.0f} MiB)"
    )
    print(
        f"  Python heap blocks: {blocks_5:,} -> {blocks_end:,}; the transcript now shows "
        f"{shown:,} tokens of the first copy (extra copies are counted on one line while "
        "they stream)"
    )
    if profiler is not None:
        print_profile(profiler, profile)
    ok_lag = p99 < LAG_TARGET_MS
    ok_mem = growth < MEMORY_TARGET_MIB
    print(f"  lag: {'PASS' if ok_lag else 'FAIL'}   memory: {'PASS' if ok_mem else 'FAIL'}")
    return 0 if ok_lag and ok_mem else 1


async def run_long(
    replies: int, tokens: int, step_s: float, manage_gc: bool = True, warmup: int = 10
) -> int:
    """A session: `replies` replies of `tokens` tokens each, one after the other."""
    config = FakeConfig(
        max_model_len=tokens + 512,
        total_blocks=(tokens + 512) // 16 + 64,
        decode_step_s=step_s,
        decode_s_per_context_token=0.0,
        reply_words=reply_words(tokens),
    )
    warmup = max(1, min(warmup, replies // 2))
    app, engine = make_app(config, manage_gc)
    lags: list[float] = []
    stop = asyncio.Event()
    async with app.run_test(size=SIZE) as pilot:
        main = app.main_screen
        while main.engine_state == "loading":
            await pilot.pause(0.05)
        main.controls.concurrency = 1
        main.controls.query_one("#max-tokens").value = str(tokens)  # type: ignore[attr-defined]
        await pilot.pause(0.2)
        gc.collect()
        host = HostLoad().start()
        probe_task = asyncio.create_task(probe(lags, stop))
        t0 = time.perf_counter()
        rss_warm = rss_mib()
        lag_warm = 0
        delivered = delivered_warm = 0
        streaming_s = streaming_warm = 0.0
        for n in range(1, replies + 1):
            main.conversation.clear()  # see the module's docstring
            started = time.perf_counter()
            await main.send(f"Reply {n}, please.", synthetic=False)
            reply = main.current
            assert reply is not None
            # Polled with a plain sleep, not pilot.pause: that queues a callback on every
            # widget on screen each time, which grows with the transcript (3x slower).
            while main.busy:  # noqa: ASYNC110 (the app has no event for "reply over")
                await asyncio.sleep(0.02)
            streaming_s += time.perf_counter() - started
            delivered += reply.primary.received
            if n == warmup:
                await pilot.pause(0.1)
                rss_warm, lag_warm = rss_mib(), len(lags)
                delivered_warm, streaming_warm = delivered, streaming_s
            if n % 25 == 0:
                print(
                    f"  after {n:>3} replies: RSS {rss_mib():6.1f} MiB, "
                    f"{time.perf_counter() - t0:5.0f} s",
                    flush=True,
                )
        await pilot.pause(0.1)
        rss_end = rss_mib()
        load = host.note()
        stop.set()
        await probe_task
        transcript_chars = len(main.chat.transcript_text())
        engine.shutdown()

    steady = lags[lag_warm:]
    p50, p99, worst = percentile(steady, 50), percentile(steady, 99), max(steady)
    growth = rss_end - rss_warm
    rate = (delivered - delivered_warm) / max(1e-9, streaming_s - streaming_warm)
    print(
        f"kvscope UI long session: {replies} replies x {tokens:,} tokens "
        f"= {delivered:,} tokens, decode step {step_s * 1000:.2f} ms, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print(f"  {load}")
    print(f"  {rate:,.0f} tokens/s while streaming (after the first {warmup} replies)")
    print(f"  event-loop lag after reply {warmup} ({len(steady)} samples, between replies too):")
    print(
        f"      p50 {p50:.2f} ms   p99 {p99:.2f} ms   max {worst:.2f} ms   "
        f"(target p99 < {LAG_TARGET_MS:.0f} ms)"
    )
    print(
        f"  RSS after {warmup} replies {rss_warm:.1f} MiB, after {replies} {rss_end:.1f} MiB: "
        f"growth {growth:+.1f} MiB (target < {LONG_MEMORY_TARGET_MIB:.0f} MiB); "
        f"the transcript holds {transcript_chars:,} characters"
    )
    ok_lag = p99 < LAG_TARGET_MS
    ok_mem = growth < LONG_MEMORY_TARGET_MIB
    print(f"  lag: {'PASS' if ok_lag else 'FAIL'}   memory: {'PASS' if ok_mem else 'FAIL'}")
    return 0 if ok_lag and ok_mem else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=None, help="fake decode step (ms)")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="leave the GC alone, to see what freezing buys"
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="cProfile the measured window (after 5 s); print the top entries, save to FILE",
    )
    parser.add_argument("--long", action="store_true", help="a 200-reply session, for memory")
    parser.add_argument(
        "--gpu-scale",
        action="store_true",
        help="256 copies of a 4,096-token prompt, a 100,000-block pool, a 25 ms step",
    )
    parser.add_argument(
        "--roofline", action="store_true", help="turn the roofline panel (F8) on first"
    )
    parser.add_argument("--replies", type=int, default=200, help="--long: how many replies")
    parser.add_argument("--tokens", type=int, default=500, help="--long: tokens per reply")
    args = parser.parse_args()
    manage_gc = not args.no_gc_freeze
    if args.long:
        # One copy at 2,000 tokens/s: a 0.5 ms step.
        step = (args.step_ms if args.step_ms is not None else 0.5) / 1000.0
        return asyncio.run(run_long(args.replies, args.tokens, step, manage_gc))
    if args.gpu_scale:
        step = (args.step_ms if args.step_ms is not None else 25.0) / 1000.0
        return asyncio.run(
            run(args.seconds, 256, step, manage_gc, args.profile, 4096, 100_000, args.roofline)
        )
    step = (args.step_ms if args.step_ms is not None else 6.0) / 1000.0
    lag = run(args.seconds, args.copies, step, manage_gc, args.profile, roofline=args.roofline)
    return asyncio.run(lag)


if __name__ == "__main__":
    sys.exit(main())
