"""`kvscope generate`: one request, headless, with exact per-token timings."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Any

from engine.events import (
    ChatMessage,
    GenerationRequest,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)
from engine.protocol import Engine


def add_generate_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate",
        help="run one request headless and print its timings",
        usage="kvscope generate [options] [vLLM engine flags]",
        description=(
            "Send one request to the engine and report TTFT, every inter-token latency,\n"
            "and what each engine step did. Any vLLM engine flag may follow\n"
            "(`kvscope engine-help` lists them)."
        ),
        epilog=(
            "examples:\n"
            "  kvscope generate --prompt-tokens 512 --max-tokens 32 --json\n"
            '  kvscope generate --prompt "Why is the sky blue?"\n'
            "  kvscope generate --prompt-tokens 2048 --max-model-len 4096 --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="a chat message, sent through the model's chat template")
    src.add_argument(
        "--prompt-tokens",
        type=int,
        metavar="N",
        help="a synthetic chat prompt of exactly N tokens (implies --ignore-eos)",
    )
    p.add_argument("--max-tokens", type=int, default=64, metavar="M", help="output tokens (64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


async def generate_once(
    engine: Engine, request: GenerationRequest, *, echo: bool = False
) -> dict[str, Any]:
    """Run `request` and collect everything `--json` prints."""
    samples: list[StepSample] = []
    remove = engine.add_step_listener(samples.append)
    text: list[str] = []
    finished: RequestFinished | None = None
    try:
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent):
                text.append(event.text)
                if echo:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, RequestFinished):
                finished = event
    finally:
        remove()
    assert finished is not None
    card = engine.card
    return {
        "ttft_s": finished.ttft_s,
        "itl_s": list(finished.itl_s),
        "e2e_s": finished.e2e_s,
        "output_tokens": finished.output_tokens,
        "prompt_tokens": finished.prompt_tokens,
        "finish_reason": finished.reason,
        "preemptions": finished.preemptions,
        "model": dataclasses.asdict(card) if card else None,
        "steps": [dataclasses.asdict(s) for s in samples],
        "text": "".join(text),
    }


def run_generate(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.launch import start_engine
    from engine.errors import BadOption

    if args.prompt_tokens is not None and args.prompt_tokens <= 0:
        raise BadOption("--prompt-tokens", f"{args.prompt_tokens} is not a positive length")
    if args.max_tokens <= 0:
        raise BadOption("--max-tokens", f"{args.max_tokens} is not a positive count")
    engine = start_engine(engine_argv)
    try:
        if args.prompt_tokens is not None:
            ids = engine.synthetic_prompt(args.prompt_tokens)
            request = GenerationRequest(
                "generate",
                prompt_token_ids=ids,
                sampling=SamplingSettings(args.max_tokens, args.temperature, ignore_eos=True),
            )
        else:
            request = GenerationRequest(
                "generate",
                messages=(ChatMessage("user", args.prompt or "Say hello in one sentence."),),
                sampling=SamplingSettings(args.max_tokens, args.temperature, args.ignore_eos),
            )
        result = asyncio.run(generate_once(engine, request, echo=not args.json))
    finally:
        engine.shutdown()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        itl = sorted(result["itl_s"])
        median = itl[len(itl) // 2] * 1000 if itl else 0.0
        print(
            f"\n\nTTFT {result['ttft_s'] * 1000:.1f} ms, median ITL {median:.1f} ms, "
            f"{result['prompt_tokens']} prompt + {result['output_tokens']} output tokens",
            file=sys.stderr,
        )
    return 0
