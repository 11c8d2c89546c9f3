"""Record the two tapes kvscope ships, from the real engine on this machine.

- `sweep-512-4096.jsonl`: the article's prompt-length sweep on the embedded model, one
  request at a time at 512, 1,024, 2,048 and 4,096 prompt tokens, 128 output tokens each
  (EOS ignored), after one warm-up request: TTFT grows with the prompt, ITL stays flat.
- `kv-pool-preemption.jsonl`: a chat turn, then 8 copies of a 512-token prompt that each
  decode 384 tokens at once. 8 x 896 tokens need 56 blocks of 128 tokens and the pool has
  44, so the pool fills as the replies grow, and vLLM preempts: the block map moves.

Both run on one engine with a 128 MiB KV pool (44 blocks on the CPU) and a context limit
of 4,352 tokens (4,096 + 256). Each tape is read back and replayed on a virtual clock,
which checks it and times the replay. The model card's local path is replaced by the
model's name, so a shipped tape names no folder of this machine.

    .venv/bin/python benchmarks/record_tapes.py                  # both, into docs/tapes/
    .venv/bin/python benchmarks/record_tapes.py --only pool --out /tmp/tapes

It needs the real engine for a few minutes: run nothing else heavy meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typing import TYPE_CHECKING

from bench.sweep import run_sweep
from bench.sweep_result import SweepConfig
from engine.clock import VirtualClock
from engine.events import (
    ChatMessage,
    GenerationRequest,
    ModelCard,
    RequestFinished,
    SamplingSettings,
)
from engine.replay import ReplayedSend, ReplayEngine
from engine.tape import RecordingEngine, Tape, TapeRecorder, read_tape

if TYPE_CHECKING:
    from engine.protocol import Engine

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ARGV = ["--max-model-len", "4352", "--kv-cache-memory-bytes", str(128 * 1024**2)]
LIMIT_BYTES = 2 * 1024**2


class ShippedRecorder(TapeRecorder):
    """Names the model instead of the folder it was loaded from."""

    def record_card(self, card: ModelCard) -> None:
        super().record_card(dataclasses.replace(card, path=card.name))


async def sweep_session(engine: Engine) -> None:
    config = SweepConfig(prompt_lens=(512, 1024, 2048, 4096), output_len=128, runs=1, warmup=1)
    result = await run_sweep(engine, config)
    for point in result.points:
        if point.ok:
            m = point.metrics
            assert m is not None
            print(
                f"  {point.prompt_len:>5,} tokens: TTFT {m.mean_ttft_ms:8,.0f} ms, "
                f"median ITL {m.median_itl_ms:5.1f} ms"
            )
        else:
            print(f"  {point.prompt_len:>5,} tokens: {point.error}")


async def pool_session(engine: RecordingEngine) -> None:
    async def run(request: GenerationRequest) -> RequestFinished:
        last = None
        async for event in engine.stream(request):
            last = event
        assert isinstance(last, RequestFinished)
        return last

    # The app's way: one user message, request IDs r<turn> and r<turn>.<copy>.
    question = "What does the KV cache hold?"
    engine.record_user_message(question, request_ids=["r1"])
    chat = (ChatMessage("user", question),)
    await run(GenerationRequest("r1", messages=chat, sampling=SamplingSettings(max_tokens=64)))

    copies = 8
    text = "Tell me a long story."
    ids = ["r2"] + [f"r2.{k}" for k in range(2, copies + 1)]
    engine.record_user_message(text, request_ids=ids, synthetic_tokens=512)
    prompts = [engine.synthetic_prompt(512, text, copy) for copy in range(copies)]
    walk = SamplingSettings(max_tokens=384, ignore_eos=True)
    done = await asyncio.gather(
        *(
            run(GenerationRequest(rid, prompt_token_ids=p, sampling=walk))
            for rid, p in zip(ids, prompts, strict=True)
        )
    )
    print(f"  {copies} copies, {sum(d.preemptions for d in done)} preemptions")


async def replay_timed(tape: Tape) -> float:
    replay = ReplayEngine(tape, clock=VirtualClock())
    tasks: list[asyncio.Task[None]] = []

    async def consume(request: GenerationRequest) -> None:
        async for _ in replay.stream(request):
            pass

    def on_send(send: ReplayedSend) -> None:
        tasks.extend(asyncio.ensure_future(consume(r)) for r in send.requests)

    replay.add_send_listener(on_send)
    replay.start()
    began = time.perf_counter()
    await replay.run()
    await asyncio.gather(*tasks)
    return time.perf_counter() - began


def describe(path: Path, recorded_s: float) -> bool:
    tape = read_tape(path)
    size = tape.size_bytes
    tokens = tape.output_tokens
    steps = len(tape.steps)
    preemptions = sum(s.preemptions for s in tape.steps)
    peak = max((s.kv_usage for s in tape.steps), default=0.0)
    span = tape.entries[-1].at - tape.entries[0].at
    replay_s = asyncio.run(replay_timed(tape))
    ok = size < LIMIT_BYTES and not tape.warnings
    print(
        f"  {path.name}: {size:,} bytes ({'under' if ok else 'NOT under'} 2 MB), "
        f"{len(tape.requests)} requests, {tokens:,} output tokens, {steps:,} steps, "
        f"{preemptions} preemptions, peak KV {peak:.0%}\n"
        f"    {size / max(tokens, 1):.0f} bytes/token, {size / max(steps, 1):.0f} bytes/step; "
        f"{span:.1f} s of session (recorded in {recorded_s:.0f} s) replays on a virtual "
        f"clock in {replay_s:.2f} s"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tapes")
    parser.add_argument("--only", choices=("sweep", "pool"), default=None)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from engine.vllm.engine import VllmEngine

    print(f"host load (1/5/15 min): {os.getloadavg()}, on {os.cpu_count()} cores")
    inner = VllmEngine(argv=ENGINE_ARGV)
    began = time.perf_counter()
    inner.start()
    print(f"engine ready in {time.perf_counter() - began:.0f} s")
    ok = True
    try:
        plans = [("sweep", "sweep-512-4096.jsonl"), ("pool", "kv-pool-preemption.jsonl")]
        for name, filename in plans:
            if args.only not in (None, name):
                continue
            path = args.out / filename
            print(f"recording {path} ...")
            engine = RecordingEngine(inner, ShippedRecorder(path))
            began = time.perf_counter()
            try:
                if name == "sweep":
                    asyncio.run(sweep_session(engine))
                else:
                    asyncio.run(pool_session(engine))
            finally:
                engine.close_tape()
            ok = describe(path, time.perf_counter() - began) and ok
    finally:
        inner.shutdown()
    print(f"host load (1/5/15 min): {os.getloadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
