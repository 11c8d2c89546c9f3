"""What does a session tape cost? JSON lines against msgpack frames, in alternating rounds.

Three encoders: JSON lines through the stdlib's `json`, the same JSON lines through
msgspec's encoder (what a tape uses where msgspec is installed: the bytes are identical),
and msgpack frames (a 4-byte length, then the record), also through msgspec.

A FakeEngine (virtual clock, the CPU engine's geometry: 128-token blocks, a 44-block pool)
plays a session: one chat turn, then 8 copies of a 512-token prompt decoding 256 tokens
each, which fills the pool and preempts. Everything a RecordingEngine hands its recorder is
captured once; then each round times, for each format, what recording it costs:

- hand-off: the `queue.put` the engine's step thread and the UI's loop pay per record;
- writer: what the writer thread pays: encode each record, serialize it, and write the
  batch of each step to an unbuffered file (one write system call per step);
- read: decoding the whole file back into events (what `kvscope replay` pays).

Bytes are per output token and per engine step. Cost per step is turned into the share of
one core the tape takes at 2,000 output tokens/s. The formats alternate within each round
(and swap order every round), and the host's load average is printed before and after,
since other work on the machine moves every number here.

The last figure is replay speed: a 10-minute session (virtual time) is recorded, then read
and replayed through a ReplayEngine on a VirtualClock, as `kvscope replay --json` would.

With `--real-engine`, it also runs the issue's end-to-end check on the real vLLM engine:
output tokens/s with and without a tape, in alternating rounds of the same batch (4
concurrent requests of a 256-token prompt, 64 output tokens each), and their ratio
(target: at least 0.99).

    python benchmarks/tape_cost.py              # 7 rounds
    python benchmarks/tape_cost.py --rounds 3
    python benchmarks/tape_cost.py --real-engine --engine-rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.clock import VirtualClock
from engine.events import ChatMessage, GenerationRequest, SamplingSettings
from engine.fake import FakeConfig, FakeEngine
from engine.replay import ReplayedSend, ReplayEngine
from engine.tape import RecordingEngine, TapeRecorder, read_tape
from engine.tape.format import Decoder, Encoder, stdlib_dumps

if TYPE_CHECKING:
    from collections.abc import Callable

TOKENS_PER_S = 2000
COPIES = 8


class CapturingRecorder(TapeRecorder):
    """A recorder that keeps what it is handed, in order, instead of writing it."""

    def __init__(self, path: Path, clock: VirtualClock) -> None:
        super().__init__(path, clock=clock)
        self.items: list[tuple[Any, Any, float]] = []

    def _put(self, kind: Any, value: Any, at: float | None = None) -> None:
        self.items.append((kind, value, self.clock.now() if at is None else at))


async def session(engine: RecordingEngine, fake: FakeEngine, copies: int, tokens: int) -> None:
    async def one(request: GenerationRequest) -> None:
        async for _ in engine.stream(request):
            pass

    engine.record_user_message("What is a KV cache?", request_ids=["r1"])
    await one(
        GenerationRequest(
            "r1",
            messages=(ChatMessage("user", "What is a KV cache?"),),
            sampling=SamplingSettings(max_tokens=64),
        )
    )
    ids = [f"r2.{k}" for k in range(copies)]
    engine.record_user_message("fill the pool", request_ids=ids, synthetic_tokens=512)
    sampling = SamplingSettings(max_tokens=tokens, ignore_eos=True)
    await asyncio.gather(
        *[
            one(
                GenerationRequest(
                    rid, prompt_token_ids=fake.synthetic_prompt(512, seed=k), sampling=sampling
                )
            )
            for k, rid in enumerate(ids)
        ]
    )


def capture(folder: Path) -> tuple[list[tuple[Any, Any, float]], int, int]:
    clock = VirtualClock()
    config = FakeConfig(max_model_len=4096, block_size=128, total_blocks=44)
    fake = FakeEngine(config, clock)
    recorder = CapturingRecorder(folder / "capture.jsonl", clock)
    engine = RecordingEngine(fake, recorder)
    engine.start()
    asyncio.run(session(engine, fake, COPIES, 256))
    engine.close_tape()
    items = recorder.items
    steps = sum(1 for kind, _, _ in items if kind == "step")
    tokens = sum(
        len(v.token_ids) for kind, v, _ in items if kind == "event" and hasattr(v, "token_ids")
    )
    return items, steps, tokens


# -- the two formats -----------------------------------------------------------------------------


def json_codec(
    dumps: Callable[[Any], bytes],
) -> tuple[Callable[[list[Any]], bytes], Callable[[bytes], int]]:
    def frame(record: list[Any]) -> bytes:
        return dumps(record) + b"\n"

    def read(data: bytes) -> int:
        decoder = Decoder()
        n = 0
        for line in data.splitlines():
            decoder.decode(json.loads(line))
            n += 1
        return n

    return frame, read


def msgpack_codec() -> tuple[Callable[[list[Any]], bytes], Callable[[bytes], int]] | None:
    try:
        import msgspec  # vLLM brings it; kvscope itself does not depend on it
    except ImportError:
        return None
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder().decode
    prefix = struct.Struct("<I")

    def frame(record: list[Any]) -> bytes:
        body = encode(record)
        return prefix.pack(len(body)) + body

    def read(data: bytes) -> int:
        decoder = Decoder()
        view = memoryview(data)
        at = n = 0
        while at < len(view):
            (size,) = prefix.unpack_from(view, at)
            at += 4
            decoder.decode(decode(view[at : at + size]))
            at += size
            n += 1
        return n

    return frame, read


def one_round(
    items: list[tuple[Any, Any, float]],
    frame: Callable[[list[Any]], bytes],
    read: Callable[[bytes], int],
    path: Path,
) -> dict[str, float]:
    # Hand-off: what the engine's threads pay.
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    t = time.perf_counter()
    for item in items:
        q.put(item)
    handoff = time.perf_counter() - t
    # Writer: encode, serialize, one write per step.
    encoder = Encoder()
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        batch: list[bytes] = []
        for kind, value, at in items:
            batch.append(frame(encoder.encode(kind, value, at)))
            if kind == "step":
                f.write(b"".join(batch))
                batch.clear()
        f.write(b"".join(batch))
    writer = time.perf_counter() - t
    data = path.read_bytes()
    t = time.perf_counter()
    read(data)
    reading = time.perf_counter() - t
    return {"handoff": handoff, "writer": writer, "read": reading, "bytes": float(len(data))}


def replay_speed(folder: Path, minutes: float) -> dict[str, float]:
    """Record `minutes` of virtual time on the fake, then read it and replay it, timed."""
    clock = VirtualClock()
    # One request at a time, a realistic decode step (40 ms, as on this CPU), long replies.
    config = FakeConfig(max_model_len=4096, block_size=128, total_blocks=44, decode_step_s=0.04)
    fake = FakeEngine(config, clock)
    path = folder / "ten-minutes.jsonl"
    recorder = TapeRecorder(path, clock=clock)
    engine = RecordingEngine(fake, recorder)
    engine.start()

    async def record() -> None:
        k = 0
        while clock.now() < minutes * 60:
            k += 1
            request = GenerationRequest(
                f"r{k}",
                prompt_token_ids=fake.synthetic_prompt(512, seed=k),
                sampling=SamplingSettings(max_tokens=1000, ignore_eos=True),
            )
            async for _ in engine.stream(request):
                pass

    asyncio.run(record())
    engine.close_tape()
    t = time.perf_counter()
    tape = read_tape(path)
    read_s = time.perf_counter() - t

    async def replay() -> None:
        replayer = ReplayEngine(tape, clock=VirtualClock())
        tasks: list[asyncio.Task[None]] = []

        async def consume(request: GenerationRequest) -> None:
            async for _ in replayer.stream(request):
                pass

        def on_send(send: ReplayedSend) -> None:
            tasks.extend(asyncio.ensure_future(consume(r)) for r in send.requests)

        replayer.add_send_listener(on_send)
        replayer.add_step_listener(lambda _s: None)
        replayer.start()
        await replayer.run()
        await asyncio.gather(*tasks)

    t = time.perf_counter()
    asyncio.run(replay())
    replay_s = time.perf_counter() - t
    return {
        "tape_s": tape.steps[-1].started_at + tape.steps[-1].duration_s,
        "steps": float(len(tape.steps)),
        "tokens": float(tape.output_tokens),
        "bytes": float(tape.size_bytes),
        "read_s": read_s,
        "replay_s": replay_s,
    }


def real_engine_ratio(folder: Path, rounds: int) -> str:
    """Output tokens/s of the real engine with and without a tape, alternating."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    inner = VllmEngine(argv=["--max-model-len", "4096", "--kv-cache-memory-bytes", str(2**27)])
    inner.start()
    sampling = SamplingSettings(max_tokens=64, ignore_eos=True)

    async def batch(engine: Any, tag: str) -> float:
        async def one(k: int) -> int:
            request = GenerationRequest(
                f"{tag}-{k}",
                prompt_token_ids=inner.synthetic_prompt(256, seed=hash((tag, k)) % 10**6),
                sampling=sampling,
            )
            n = 0
            async for event in engine.stream(request):
                n += len(getattr(event, "token_ids", ()))
            return n

        began = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(k) for k in range(4))))
        return tokens / (time.perf_counter() - began)

    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        asyncio.run(batch(inner, "warm"))
        for i in range(rounds):
            for taped in (False, True) if i % 2 == 0 else (True, False):
                if taped:
                    engine = RecordingEngine(inner, TapeRecorder(folder / f"real-{i}.jsonl"))
                    rates[True].append(asyncio.run(batch(engine, f"t{i}")))
                    engine.close_tape()
                else:
                    rates[False].append(asyncio.run(batch(inner, f"n{i}")))
    finally:
        inner.shutdown()
    without, with_tape = statistics.median(rates[False]), statistics.median(rates[True])
    return (
        f"real engine, median of {rounds} alternating rounds: {without:.1f} output tokens/s "
        f"without a tape, {with_tape:.1f} with one: {with_tape / without:.3f}x "
        "(target: at least 0.99x)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--minutes", type=float, default=10.0, help="the replayed session")
    parser.add_argument("--real-engine", action="store_true", help="also time vLLM with a tape")
    parser.add_argument("--engine-rounds", type=int, default=6)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        items, steps, tokens = capture(folder)
        formats: dict[str, tuple[Callable[[list[Any]], bytes], Callable[[bytes], int]]] = {
            "json, stdlib": json_codec(stdlib_dumps())
        }
        codec = msgpack_codec()
        if codec is not None:
            import msgspec

            formats["json, msgspec"] = json_codec(msgspec.json.Encoder().encode)
            formats["msgpack"] = codec
        results: dict[str, list[dict[str, float]]] = {name: [] for name in formats}
        names = list(formats)
        for i in range(args.rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                frame, read = formats[name]
                results[name].append(one_round(items, frame, read, folder / "tape.bin"))
        speed = replay_speed(folder, args.minutes)
        real = real_engine_ratio(folder, args.engine_rounds) if args.real_engine else ""
    load_after = os.getloadavg()

    per_step = tokens / steps
    steps_per_s = TOKENS_PER_S / per_step
    print(
        f"session: {len(items):,} records, {steps:,} steps, {tokens:,} output tokens "
        f"({per_step:.1f} tokens/step; at {TOKENS_PER_S:,} tokens/s that is "
        f"{steps_per_s:,.0f} steps/s); median of {args.rounds} alternating rounds"
    )
    print(
        f"host load (1/5/15 min): before {load_before}, after {load_after}, "
        f"on {os.cpu_count()} cores"
    )
    print()
    header = (
        f"{'format':<16}{'bytes/token':>12}{'bytes/step':>12}{'hand-off µs/step':>18}"
        f"{'writer µs/step':>16}{'core at 2k tok/s':>18}{'read µs/step':>14}"
    )
    print(header)
    for name, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        handoff = med["handoff"] / steps * 1e6
        writer = med["writer"] / steps * 1e6
        share = (handoff + writer) * 1e-6 * steps_per_s
        print(
            f"{name:<16}{med['bytes'] / tokens:>12.1f}{med['bytes'] / steps:>12.1f}"
            f"{handoff:>18.2f}{writer:>16.1f}{share:>17.2%}{med['read'] / steps * 1e6:>14.1f}"
        )
    if codec is None:
        print("(msgspec is not installed here: only the stdlib's JSON encoder was measured)")
    print()
    print(
        f"replay: a {speed['tape_s'] / 60:.1f}-minute session ({speed['steps']:,.0f} steps, "
        f"{speed['tokens']:,.0f} tokens, {speed['bytes'] / 2**20:.1f} MiB) reads in "
        f"{speed['read_s']:.2f} s and replays on a virtual clock in {speed['replay_s']:.2f} s "
        f"(target: under 2 s)"
    )
    if real:
        print(real)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
