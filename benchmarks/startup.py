"""Benchmark (not a test): process start to the first token, kvscope against bare vLLM.

Each round starts two fresh processes, one after the other, alternating which goes first:
  bare     python: import vLLM, LLMEngine.from_engine_args, add_request, step to a token
  kvscope  `kvscope generate` on the same model and flags, to its first token
Both are timed from spawning the process to the first token it prints. It prints each
round's ratio (kvscope / bare), the median, and the host load during each.

    .venv/bin/python benchmarks/startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import HostLoad

# kvscope as a user starts it (no flags: its CPU defaults), and bare vLLM given the same
# settings: the model's own max_model_len, a 256 MiB KV pool, eager mode.
FLAGS: list[str] = []

BARE = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.v1.engine.llm_engine import LLMEngine
args = EngineArgs(model=sys.argv[1], kv_cache_memory_bytes=256 * 1024**2,
                  enforce_eager=True, gpu_memory_utilization=0.5, use_tqdm_on_load=False)
engine = LLMEngine.from_engine_args(args)
engine.add_request("r", TokensPrompt(prompt_token_ids=list(range(100, 132))),
                   SamplingParams(max_tokens=2, ignore_eos=True))
while True:
    if any(o.outputs and o.outputs[0].token_ids for o in engine.step()):
        print("FIRST", flush=True)
        break
os._exit(0)
"""


OURS = """
import asyncio, os, sys
from cli.launch import running_engine
from engine.events import GenerationRequest, SamplingSettings, TokenEvent
async def main(engine):
    request = GenerationRequest("r", prompt_token_ids=tuple(range(100, 132)),
                                sampling=SamplingSettings(max_tokens=2, ignore_eos=True))
    async for event in engine.stream(request):
        if isinstance(event, TokenEvent):
            print("FIRST", flush=True)
            os._exit(0)
with running_engine(sys.argv[1:]) as engine:
    asyncio.run(main(engine))
"""


def first_token_s(cmd: list[str]) -> float:
    started = time.perf_counter()
    env = dict(os.environ, TQDM_DISABLE="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    elapsed = float("nan")
    for line in proc.stdout:
        if line.startswith("FIRST"):
            elapsed = time.perf_counter() - started
            break
    proc.kill()
    proc.wait()
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from engine.model_prep import embedded_model_dir

    model = str(embedded_model_dir())
    bare = [sys.executable, "-c", BARE, model]
    # kvscope's own path: vLLM's flags parsed with kvscope's defaults, the embedded model
    # checked, the engine and its step thread started, one request streamed.
    ours = [sys.executable, "-c", OURS, *FLAGS]
    print(f"kvscope start-up benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    print(f"{'round':>5}  {'bare s':>7}  {'kvscope s':>9}  {'ratio':>6}  host (bare | kvscope)")
    ratios = []
    for r in range(args.rounds):
        order = ("bare", "kvscope") if r % 2 == 0 else ("kvscope", "bare")
        t: dict[str, float] = {}
        notes: dict[str, str] = {}
        for who in order:
            load = HostLoad().start()
            t[who] = first_token_s(bare if who == "bare" else ours)
            notes[who] = load.note()
        ratios.append(t["kvscope"] / t["bare"])
        print(
            f"{r + 1:>5}  {t['bare']:>7.2f}  {t['kvscope']:>9.2f}  {ratios[-1]:>6.3f}  "
            f"{notes['bare']} | {notes['kvscope']}"
        )
    print(f"median ratio (kvscope / bare): {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
