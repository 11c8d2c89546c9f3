"""`kvscope generate`: one request, headless, with exact per-token timings.

Every input is checked before anything heavy starts: the flags themselves first (no
engine, no vLLM import), then against the context limit when --max-model-len is given
(before the model or the engine is touched), and once more against the engine's real
limit before a synthetic prompt is built, so a huge length never allocates anything.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.load_loops import failure_cause
from bench.records import request_record, step_perf_summary, step_records
from engine.clock import RealClock
from engine.errors import BadOption, ConnectionLost, KvscopeError, PromptTooLong
from engine.events import (
    ChatMessage,
    GenerationRequest,
    ReplicaServed,
    RequestAccepted,
    RequestFinished,
    SamplingSettings,
    StepSample,
    TokenEvent,
)
from engine.remote.timeouts import ServerStalled
from engine.stats import percentile
from engine.visible_text import visible

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.events import ModelCard
    from engine.protocol import Engine
    from roofline.step_perf import StepModel

DEFAULT_PROMPT = "Say hello in one sentence."
# Far past any context window this tool can send (1M tokens are a few MB of text); a
# bigger file is a mistake, and reading it whole would only eat memory.
MAX_PROMPT_FILE_BYTES = 64 * 1024**2


def add_generate_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
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
            "  kvscope generate --prompt-file question.txt\n"
            "  cat question.txt | kvscope generate --prompt-file -\n"
            "  kvscope generate --prompt-tokens 2048 --max-model-len 4096 --json\n"
            "\n"
            "exit status: 0 when the reply finished; 1 when it did not or the request\n"
            "failed (one line on stderr says why). A reply that stopped part way (a\n"
            "--timeout ran out, the connection was cut) is still printed: with --json,\n"
            "the object holds what came, finish_reason null, failure (timeout, cut) and\n"
            "error (the line's words). 2 for a bad flag."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from cli.attach import add_attach_args

    add_attach_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        help=f"a chat message, sent through the model's chat template ({DEFAULT_PROMPT!r})",
    )
    src.add_argument(
        "--prompt-file",
        metavar="PATH",
        help="read the chat message from a file (UTF-8), or from stdin with -",
    )
    src.add_argument(
        "--prompt-tokens",
        type=int,
        metavar="N",
        help="a synthetic chat prompt of exactly N tokens (implies --ignore-eos)",
    )
    p.add_argument("--max-tokens", type=int, default=64, metavar="M", help="output tokens (64)")
    p.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature, 0 = greedy (0)"
    )
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    from cli.session_tape import add_record_arg

    add_record_arg(p)
    return p


@dataclass(frozen=True)
class GenerateInputs:
    """The request as the user typed it, checked."""

    prompt: str | None
    prompt_tokens: int | None
    sampling: SamplingSettings
    notices: tuple[str, ...] = field(default=())


def decode_prompt(raw: bytes, option: str) -> tuple[str, str | None]:
    """Text from bytes that should be UTF-8; bytes that are not become U+FFFD, and the
    second value says how many, so the user knows the prompt is not what they sent."""
    text = raw.decode("utf-8", "replace")
    bad = len(raw) - len(raw.decode("utf-8", "ignore").encode("utf-8"))
    if not bad:
        return text, None
    s = "" if bad == 1 else "s"
    return text, f"{option} is not valid UTF-8: {bad:,} byte{s} replaced by U+FFFD"


def _read_prompt_file(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read(MAX_PROMPT_FILE_BYTES + 1)
    try:
        with Path(path).open("rb") as fh:
            return fh.read(MAX_PROMPT_FILE_BYTES + 1)
    except OSError as exc:
        raise BadOption("--prompt-file", f"cannot read {path}: {exc.strerror}") from None


def read_inputs(args: argparse.Namespace) -> GenerateInputs:
    """Check what can be checked from the flags alone; raises BadOption."""
    if args.prompt_tokens is not None and args.prompt_tokens <= 0:
        raise BadOption("--prompt-tokens", f"{args.prompt_tokens:,} is not a positive length")
    if args.max_tokens <= 0:
        raise BadOption("--max-tokens", f"{args.max_tokens:,} is not a positive count")
    temperature = args.temperature
    if not math.isfinite(temperature) or temperature < 0:
        raise BadOption(
            "--temperature",
            f"{temperature} is not a temperature: give 0 (greedy) or a finite number above 0",
        )
    notices: list[str] = []
    prompt: str | None = None
    if args.prompt is not None:
        # Python turned bytes that are not UTF-8 into lone surrogates; fsencode gives the
        # exact bytes back, and a tokenizer (or json) would choke on the surrogates.
        prompt, notice = decode_prompt(os.fsencode(args.prompt), "--prompt")
        if not prompt.strip():
            raise BadOption(
                "--prompt",
                f"it is empty; give some text, or leave --prompt out to send {DEFAULT_PROMPT!r}",
            )
        notices += [notice] if notice else []
    elif getattr(args, "prompt_file", None) is not None:
        raw = _read_prompt_file(args.prompt_file)
        if len(raw) > MAX_PROMPT_FILE_BYTES:
            raise BadOption(
                "--prompt-file",
                f"{args.prompt_file} is over {MAX_PROMPT_FILE_BYTES:,} bytes, far past "
                "any context window",
            )
        prompt, notice = decode_prompt(raw, "--prompt-file")
        if not prompt.strip():
            where = "stdin" if args.prompt_file == "-" else args.prompt_file
            raise BadOption("--prompt-file", f"{where} holds no text")
        notices += [notice] if notice else []
    elif args.prompt_tokens is None:
        prompt = DEFAULT_PROMPT
    synthetic = args.prompt_tokens is not None
    sampling = SamplingSettings(
        max_tokens=args.max_tokens,
        temperature=temperature,
        ignore_eos=synthetic or args.ignore_eos,
    )
    return GenerateInputs(prompt, args.prompt_tokens, sampling, tuple(notices))


def check_against_limit(inputs: GenerateInputs, max_model_len: int | None) -> None:
    """vLLM's rule, before anything is built: the prompt must leave room for one output
    token (a prompt of max_model_len tokens is refused), and so must the output."""
    if not max_model_len:
        return
    if inputs.prompt_tokens is not None and inputs.prompt_tokens >= max_model_len:
        raise PromptTooLong(inputs.prompt_tokens, max_model_len)
    if inputs.sampling.max_tokens >= max_model_len:
        raise BadOption(
            "--max-tokens",
            f"{inputs.sampling.max_tokens:,} is not below the context limit (max_model_len) "
            f"of {max_model_len:,}, which the prompt and the output share",
        )


def build_request(engine: Engine, inputs: GenerateInputs) -> GenerationRequest:
    if inputs.prompt_tokens is not None:
        return GenerationRequest(
            "generate",
            prompt_token_ids=engine.synthetic_prompt(inputs.prompt_tokens),
            sampling=inputs.sampling,
        )
    assert inputs.prompt is not None
    return GenerationRequest(
        "generate", messages=(ChatMessage("user", inputs.prompt),), sampling=inputs.sampling
    )


class ReplyUnfinished(Exception):
    """A reply that stopped part way (a --timeout ran out, the connection was cut):
    `result` is what came, as --json prints it, and `error` why, as the command ends."""

    def __init__(self, result: dict[str, Any], error: KvscopeError) -> None:
        super().__init__(result, error)
        self.result = result
        self.error = error


def unfinished_record(
    request_id: str,
    prompt_tokens: int | None,
    tokens: Sequence[TokenEvent],
    error: ServerStalled | ConnectionLost,
    failed_after_s: float,
) -> dict[str, Any]:
    """A reply as far as it got, with request_record's keys (and the bench JSON's for a
    failed request: `failure`, `error`, `failed_after_s`): no finish, no end-to-end time.

    A token event's latency is since the one before (the first's since the request); the
    tokens of one event arrived together, so their ITLs after its first are 0."""
    gaps: list[float] = []
    for i, event in enumerate(tokens):
        after = tokens[i + 1].index if i + 1 < len(tokens) else error.tokens_received
        gaps += [event.latency_s] + [0.0] * max(after - event.index - 1, 0)
    return {
        "request_id": request_id,
        "prompt_tokens": prompt_tokens,
        "output_tokens": error.tokens_received,
        "finish_reason": None,
        "failure": failure_cause(error),
        "error": error.plain(),
        "ttft_s": gaps[0] if gaps else None,
        "itl_s": gaps[1:],
        "e2e_s": None,  # it never ended: failed_after_s says when it stopped
        "failed_after_s": failed_after_s,
        "preemptions": 0,
        "cached_prompt_tokens": None,
    }


async def generate_once(
    engine: Engine, request: GenerationRequest, *, echo: bool = False
) -> dict[str, Any]:
    """Run `request` and collect everything `--json` prints.

    Raises:
        ReplyUnfinished: the reply stopped part way; it holds what came.
    """
    samples: list[StepSample] = []

    def on_step(sample: StepSample) -> None:
        # Only real steps: the sample the engine sends once it falls idle did no work,
        # and whether it lands before this listener goes is a race.
        if not sample.idle:
            samples.append(sample)

    remove = engine.add_step_listener(on_step)
    text: list[str] = []
    tokens: list[TokenEvent] = []
    prompt_tokens: int | None = None
    finished: RequestFinished | None = None
    clock = engine.features.clock or RealClock()  # the clock the engine stamps times on
    began = clock.now()
    try:
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent):
                text.append(event.text)
                tokens.append(event)
                if echo:
                    # The server's text, shown: its escape codes must not drive the terminal.
                    sys.stdout.write(visible(event.text))
                    sys.stdout.flush()
            elif isinstance(event, RequestAccepted):
                prompt_tokens = event.prompt_tokens or None  # 0: the server did not say
            elif isinstance(event, RequestFinished):
                finished = event
    except (ServerStalled, ConnectionLost) as exc:
        # Their words say "the reply so far is kept": so it is, in what --json prints.
        if tokens:  # the engine's own submission time, not this side's
            began = tokens[0].time_s - tokens[0].latency_s
        record = unfinished_record(
            request.request_id, prompt_tokens, tokens, exc, clock.now() - began
        )
        raise ReplyUnfinished(_with_context(engine, record, samples, text), exc) from None
    finally:
        remove()
    assert finished is not None
    return _with_context(engine, request_record(finished), samples, text)


def _with_context(
    engine: Engine, record: dict[str, Any], samples: list[StepSample], text: list[str]
) -> dict[str, Any]:
    """The request's record with the model, the steps seen and the reply's text."""
    card = engine.card
    remote = engine.features.remote is not None
    model, missing = (None, "") if remote else _step_model(card)
    steps = step_records(samples, model)
    result = {
        **record,
        "model": dataclasses.asdict(card) if card else None,
        # Attached to a server there are no steps: these are its /metrics scrapes.
        "steps_are": "scrapes" if remote else "engine steps",
        "steps": steps,
        "text": "".join(text),
    }
    if not remote:
        result["step_perf"] = step_perf_summary(steps, missing)
    return result


def _step_model(card: ModelCard | None) -> tuple[StepModel | None, str]:
    """kvscope's roofline model of the engine's steps, or why there is none."""
    from roofline.hardware import load_geometry
    from roofline.step_perf import StepModel

    if card is None:
        return None, "the engine has no model card"
    if card.parallel:
        # vLLM counts per GPU of the model's split; kvscope's model is of the whole model.
        return None, f"vLLM counts per GPU of {card.parallel}; kvscope's model is one device's"
    try:
        return StepModel.for_card(load_geometry(card.path), card), ""
    except BadOption as exc:
        return None, f"kvscope has no roofline model of {card.name}: {exc.reason}"


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    # The same interpolated median as the reply footer and the bench.
    median = percentile(result["itl_s"], 50) * 1000
    print(
        f"\n\nTTFT {result['ttft_s'] * 1000:.1f} ms, median ITL {median:.1f} ms, "
        f"{result['prompt_tokens']} prompt + {result['output_tokens']} output tokens",
        file=sys.stderr,
    )
    fleet = result.get("fleet")
    if fleet:  # the reply footer's words, where a fleet says which replica served it
        print("; ".join(ReplicaServed(**fleet).words()), file=sys.stderr)
    handoff = result.get("handoff")
    if handoff:  # prefill on one server, decode on another: the TTFT's two halves
        parts = " + ".join(f"{k} {v * 1000:.1f} ms" for k, v in handoff["ttft_parts_s"].items())
        print(f"TTFT = {parts}", file=sys.stderr)
        print(handoff["words"], file=sys.stderr)


def run_generate(args: argparse.Namespace, engine_argv: list[str]) -> int:
    from cli.engine_choice import started_engine
    from cli.launch import int_flag, say

    inputs = read_inputs(args)  # bad flags stop here, before vLLM is even imported
    check_against_limit(inputs, int_flag(engine_argv, "--max-model-len"))
    for notice in inputs.notices:
        say(notice)
    with started_engine(
        args,
        engine_argv,
        check=lambda flags: check_against_limit(inputs, flags.max_model_len),
        tape=args.tape,
    ) as engine:
        card = engine.card
        check_against_limit(inputs, card.max_model_len if card else None)
        request = build_request(engine, inputs)
        try:
            result = asyncio.run(generate_once(engine, request, echo=not args.json))
        except ReplyUnfinished as cut:
            if args.json:  # what came, and why it stopped; the error line follows
                print_result(cut.result, True)
            raise cut.error from None
        # Printed before the engine stops: shutting down can take a moment.
        print_result(result, args.json)
        remote = engine.features.remote
        caps = remote.capabilities if remote is not None else None
        if caps is not None and caps.metrics and caps.metrics_note:
            say(caps.metrics_note)  # metrics flowed, but some samples were bad and dropped
    return 0
