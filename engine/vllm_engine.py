"""The real engine: vLLM's LLMEngine in this process, stepped by one dedicated thread.

Why one thread: `LLMEngine.step()` is the only place tokens are made, so a thread that owns
the engine and calls `step()` in a loop sees exact step boundaries and can stamp every
token with the step that produced it. Requests and aborts reach that thread through a
command queue, so vLLM is only ever touched from it. Events go back to whichever asyncio
loop asked for them via `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import queue
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import (
    EngineDied,
    EngineStartFailed,
    KvPoolTooSmall,
    KvscopeError,
    ModelNotFound,
    PromptTooLong,
)
from engine.events import (
    ChatMessage,
    EmulationInfo,
    EngineEvent,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    ProgressCallback,
    RequestAccepted,
    RequestFinished,
    StepListener,
    StepSample,
    TokenEvent,
)
from engine.listeners import StepListeners
from engine.paths import engine_log_path
from engine.relay import relay

GIB = 1024**3
_SENTINEL = "\x00kvscope-sentinel\x00"


@dataclass
class _Live:
    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[EngineEvent | BaseException]
    internal_id: str = ""
    submitted_at: float = 0.0
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    done: bool = False

    def put(self, item: EngineEvent | BaseException) -> None:
        # A RuntimeError means the consumer's loop is gone: nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def route_vllm_logs(path: str | os.PathLike[str]) -> None:
    """Send vLLM's log lines to a file: on a terminal UI they would tear the screen."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    log = logging.getLogger("vllm")
    if not any(getattr(h, "_kvscope", False) for h in log.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._kvscope = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def map_start_error(
    exc: BaseException,
    *,
    model: str,
    max_model_len: int | None,
    kv_bytes_per_token: int | None,
    block_size: int | None,
    kv_cache_memory_bytes: int | None,
) -> KvscopeError:
    """Turn what vLLM raised at start-up into one of kvscope's typed errors."""
    if isinstance(exc, KvscopeError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    m = re.search(
        r"max seq len \((\d+)\).*?([\d.]+) GiB KV cache is needed.*?available KV cache "
        r"memory \(([\d.]+) GiB\)",
        text,
        re.S,
    )
    if m:
        length = int(m.group(1))
        est = re.search(r"estimated maximum model length is (\d+)", text)
        needed = int(float(m.group(2)) * GIB)
        if kv_bytes_per_token:
            # vLLM rounds to 2 decimals of a GiB; our own geometry is exact.
            bs = block_size or 1
            needed = math.ceil(length / bs) * bs * kv_bytes_per_token
        available = kv_cache_memory_bytes or int(float(m.group(3)) * GIB)
        return KvPoolTooSmall(needed, available, int(est.group(1)) if est else None, length)
    if "No available memory for the cache blocks" in text:
        return KvPoolTooSmall(
            (max_model_len or 0) * (kv_bytes_per_token or 0), 0, None, max_model_len
        )
    not_found = (
        "not a valid model identifier",
        "does not appear to have",
        "Repository Not Found",
        "RepositoryNotFoundError",
        "LocalEntryNotFoundError",
        "Invalid repository ID",
        "No such file or directory",
        "is not a local folder",
        "Can't load the configuration",
        "couldn't connect",
        "OfflineModeIsEnabled",
        "Cannot find any model",
    )
    if any(s.lower() in text.lower() for s in not_found):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ModelNotFound(model, first[:200])
    first_line = text.strip().splitlines()[0][:300]
    return EngineStartFailed(first_line)


class VllmEngine:
    """kvscope's Engine protocol on top of an in-process vLLM V1 LLMEngine."""

    def __init__(
        self,
        engine_args: Any = None,
        *,
        argv: Sequence[str] | None = None,
        model_label: str | None = None,
        emulation: EmulationInfo | None = None,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Either ready EngineArgs, or vLLM flags (`argv`) that `start()` parses.

        With `argv`, parsing, importing vLLM and preparing the embedded model all happen
        in `start()`, so a UI can show itself first and report progress while they run.
        """
        if engine_args is None and argv is None:
            argv = []
        self.engine_args = engine_args
        self.argv = list(argv) if argv is not None else None
        self.model_label = model_label or (str(engine_args.model) if engine_args else "")
        self.emulation = emulation
        self.log_path = log_path or engine_log_path()
        self._card: ModelCard | None = None
        self._listeners = StepListeners()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._live: dict[str, _Live] = {}  # by the caller's request ID
        self._internal: dict[str, str] = {}  # vLLM's internal ID -> caller's ID
        self._dead: str | None = None
        self._step = 0
        self._tokenizer: Any = None
        self._filler_ids: list[int] | None = None

    # -- life cycle -------------------------------------------------------------------------
    @property
    def card(self) -> ModelCard | None:
        return self._card

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Load the model and start the step thread; blocks until ready or failed."""
        report = progress or (lambda _p: None)
        if self._thread is not None and self._thread.is_alive() and not self._dead and self._card:
            # Already running (a UI handed an engine that a test or script started).
            report(LoadProgress("ready", 1.0))
            return self._card
        if self._thread is not None:
            self.shutdown()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._stop.clear()
        self._dead = None
        self._step = 0

        def main() -> None:
            try:
                engine = self._build(report)
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._run(engine)

        self._thread = threading.Thread(target=main, name="kvscope-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join(timeout=30)
            self._thread = None
            raise failure[0]
        assert self._card is not None
        report(LoadProgress("ready", 1.0))
        return self._card

    def _build(self, report: ProgressCallback) -> Any:
        # Must be set before vLLM reads its environment: the engine core then lives in
        # this process, where the scheduler and block pool can be read.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        route_vllm_logs(self.log_path)
        report(LoadProgress("importing vLLM", 0.05))
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401  (import cost shows here)
        from vllm.v1.engine.llm_engine import LLMEngine

        from engine.vllm_internals import EngineIntrospector

        if self.engine_args is None:
            from engine.options import build_engine_settings

            def on_model(stage: str, fraction: float) -> None:
                report(LoadProgress(f"preparing model: {stage}", 0.05 + 0.1 * fraction))

            settings = build_engine_settings(self.argv or [], on_model)
            self.engine_args = settings.engine_args
            self.model_label = settings.model_label
        args = self.engine_args
        geometry: dict[str, int] = {}
        try:
            report(LoadProgress("reading model config", 0.15))
            geometry = _read_geometry(str(args.model))
            report(LoadProgress("loading weights and sizing the KV pool", 0.3))
            engine = LLMEngine.from_engine_args(args)
        except BaseException as exc:
            self._cleanup_distributed()
            raise map_start_error(
                exc,
                model=str(args.model),
                max_model_len=args.max_model_len,
                kv_bytes_per_token=geometry.get("kv_bytes_per_token"),
                block_size=geometry.get("block_size") or args.block_size,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes,
            ) from exc
        report(LoadProgress("reading the KV pool", 0.9))
        self._introspector = EngineIntrospector(engine)
        self._tokenizer = engine.get_tokenizer()
        self._filler_ids = None
        self._card = self._make_card(engine)
        return engine

    def _make_card(self, engine: Any) -> ModelCard:
        cfg = engine.vllm_config
        mc = cfg.model_config
        hf = mc.hf_text_config
        layers = int(hf.num_hidden_layers)
        kv_heads = int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads)
        head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
        dtype = str(mc.dtype).replace("torch.", "")
        dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 2)
        cache_dtype = str(cfg.cache_config.cache_dtype)
        if cache_dtype.startswith("fp8"):
            dtype_bytes = 1
        from vllm.platforms import current_platform

        return ModelCard(
            name=self.model_label,
            path=str(mc.model),
            dtype=dtype,
            num_layers=layers,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            kv_bytes_per_token=2 * layers * kv_heads * head_dim * dtype_bytes,
            max_model_len=int(mc.max_model_len),
            block_size=self._introspector.block_size,
            total_blocks=self._introspector.total_blocks,
            device=str(current_platform.device_type),
            emulation=self.emulation,
        )

    def shutdown(self) -> None:
        """Stop the step thread, fail whatever is still live, free the engine."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._commands.put(("wake", None))
        thread.join(timeout=60)
        self._thread = None
        for live in list(self._live.values()):
            live.put(EngineDied("the engine was shut down"))
        self._live.clear()

    def _cleanup_distributed(self) -> None:
        # A second engine in the same process (restart after a failure) needs vLLM's
        # process-wide distributed state torn down first.
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except Exception:
            pass

    # -- the step thread ---------------------------------------------------------------------
    def _run(self, engine: Any) -> None:
        try:
            while not self._stop.is_set():
                idle = not engine.has_unfinished_requests()
                self._drain(engine, block=idle)
                if self._stop.is_set():
                    break
                if engine.has_unfinished_requests():
                    self._one_step(engine)
        except BaseException as exc:  # the engine is unusable now; say why to everyone
            lines = str(exc).strip().splitlines()
            self._dead = f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
            logging.getLogger("vllm").exception("kvscope: engine step failed")
            for live in list(self._live.values()):
                live.put(EngineDied(self._dead))
            self._live.clear()
        finally:
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()
            del engine
            self._cleanup_distributed()

    def _drain(self, engine: Any, *, block: bool) -> None:
        while True:
            try:
                kind, payload = (
                    self._commands.get(timeout=0.5) if block else (self._commands.get_nowait())
                )
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._add(engine, payload)
            elif kind == "abort":
                self._abort(engine, payload)
            elif kind == "call":
                payload(engine)

    def _add(self, engine: Any, live: _Live) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sp = live.request.sampling
        params = SamplingParams(
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            ignore_eos=sp.ignore_eos,
            seed=sp.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        rid = live.request.request_id
        live.submitted_at = time.perf_counter()
        try:
            internal = engine.add_request(
                rid, TokensPrompt(prompt_token_ids=list(live.prompt_ids)), params
            )
        except Exception as exc:
            said = re.search(r"maximum context length is (\d+)", str(exc))
            if said:
                live.put(PromptTooLong(len(live.prompt_ids), int(said.group(1))))
            else:
                live.put(EngineStartFailed(f"vLLM refused the request: {exc}"))
            self._live.pop(rid, None)
            return
        live.internal_id = str(internal)
        self._internal[live.internal_id] = rid
        live.put(RequestAccepted(rid, len(live.prompt_ids), live.submitted_at))

    def _abort(self, engine: Any, rid: str) -> None:
        live = self._live.get(rid)
        if live is None or live.done:
            return
        engine.abort_request([rid])
        self._finish(live, "abort", time.perf_counter())

    def _finish(self, live: _Live, reason: str, now: float) -> None:
        live.done = True
        times = live.token_times
        live.put(
            RequestFinished(
                request_id=live.request.request_id,
                reason=reason,
                prompt_tokens=len(live.prompt_ids),
                output_tokens=live.output_tokens,
                ttft_s=(times[0] - live.submitted_at) if times else None,
                itl_s=tuple(b - a for a, b in itertools.pairwise(times)),
                e2e_s=(times[-1] if times else now) - live.submitted_at,
                preemptions=live.preemptions,
            )
        )
        self._live.pop(live.request.request_id, None)
        self._internal.pop(live.internal_id, None)

    def _one_step(self, engine: Any) -> None:
        started = time.perf_counter()
        outputs = engine.step()
        ended = time.perf_counter()
        self._step += 1
        intro = self._introspector
        work = intro.take_scheduled()
        preempted = tuple(self._internal.get(i, i) for i in work.preempted_internal_ids)
        for rid in preempted:
            if rid in self._live:
                self._live[rid].preemptions += 1
        sample = StepSample(
            step=self._step,
            started_at=started,
            duration_s=ended - started,
            prefill_tokens=work.prefill_tokens,
            decode_tokens=work.decode_tokens,
            running=intro.num_running(),
            waiting=intro.num_waiting(),
            kv_usage=intro.usage(),
            free_blocks=intro.free_blocks(),
            total_blocks=intro.total_blocks,
            block_size=intro.block_size,
            blocks=intro.live_blocks(self._internal),
            preemptions=len(preempted),
            preempted_ids=preempted,
        )
        # Listeners first: a consumer that stops listening when its request finishes
        # must still see the step that finished it.
        self._listeners.emit(sample)
        for out in outputs:
            rid = self._internal.get(out.request_id, out.request_id)
            live = self._live.get(rid)
            if live is None or live.done or not out.outputs:
                continue
            completion = out.outputs[0]
            new_ids = tuple(completion.token_ids)
            if new_ids:
                prev = live.token_times[-1] if live.token_times else live.submitted_at
                live.put(
                    TokenEvent(
                        request_id=rid,
                        index=live.output_tokens,
                        token_ids=new_ids,
                        text=completion.text,
                        step=self._step,
                        time_s=ended,
                        latency_s=ended - prev,
                    )
                )
                live.output_tokens += len(new_ids)
                # Tokens that arrive together share one time: their ITL after the first is 0.
                live.token_times.extend([ended] * len(new_ids))
            if out.finished:
                reason = str(completion.finish_reason or "stop")
                self._finish(live, "length" if reason == "length" else reason, ended)

    # -- the protocol --------------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if self._dead:
            raise EngineDied(self._dead)
        if self._thread is None or self._card is None:
            raise EngineDied("the engine is not running")
        ids = (
            tuple(request.prompt_token_ids)
            if request.prompt_token_ids is not None
            else self.chat_prompt_ids(request.messages)
        )
        if len(ids) > self._card.max_model_len:
            raise PromptTooLong(len(ids), self._card.max_model_len)
        if request.request_id in self._live:
            raise ValueError(f"request ID {request.request_id!r} is already running")
        live = _Live(request, ids, asyncio.get_running_loop(), asyncio.Queue())
        self._live[request.request_id] = live
        self._commands.put(("add", live))
        try:
            async for event in relay(live.queue):
                yield event
        finally:
            if not live.done:
                # The consumer stopped listening: give the blocks back.
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineDied("the engine is not running")
        return self._tokenizer

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        tok = self._require_tokenizer()
        out = tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
        if hasattr(out, "keys"):
            out = out["input_ids"]
        return tuple(int(i) for i in out)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        return build_synthetic_prompt(
            self._require_tokenizer(), num_tokens, suffix, seed, cache=self
        )

    @property
    def introspection(self) -> Any:
        """The vLLM internals reader, for tests only."""
        return self._introspector

    async def pool_state(self) -> tuple[int, int]:
        """(free blocks, total blocks), read on the step thread between steps."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()

        def read(_engine: Any) -> None:
            value = (self._introspector.free_blocks(), self._introspector.total_blocks)
            loop.call_soon_threadsafe(future.set_result, value)

        self._commands.put(("call", read))
        return await future


def _read_geometry(model: str) -> dict[str, int]:
    """KV bytes per token from the model's config, to explain a too-small pool exactly."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model)
        cfg = getattr(cfg, "text_config", None) or cfg
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return {"kv_bytes_per_token": 2 * layers * kv * head_dim * 2}
    except Exception:
        return {}


def filler_vocabulary(tokenizer: Any) -> list[int]:
    """Token IDs that decode to one plain lowercase word with a leading space."""
    word = re.compile(r"^ [a-z]{3,10}$")
    ids = []
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab_size = len(tokenizer)
    for i in range(min(vocab_size, 50_000)):
        if i in special:
            continue
        if word.match(tokenizer.decode([i])):
            ids.append(i)
    return ids


def build_synthetic_prompt(
    tokenizer: Any, num_tokens: int, suffix: str = "", seed: int = 0, *, cache: Any = None
) -> tuple[int, ...]:
    """Exactly `num_tokens` token IDs: the chat template around random words and `suffix`.

    IDs are joined, never re-tokenized, so the count is exact. Random words (seeded) keep
    requests from sharing a prefix, which prefix caching would otherwise skip.
    """
    if num_tokens <= 0:
        raise ValueError("num_tokens must be positive")
    filler = getattr(cache, "_filler_ids", None)
    if filler is None:
        filler = filler_vocabulary(tokenizer)
        if cache is not None:
            cache._filler_ids = filler
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True, tokenize=False
    )
    head_text, _, tail_text = rendered.partition(_SENTINEL)
    head = tokenizer.encode(head_text, add_special_tokens=False)
    tail = tokenizer.encode(tail_text, add_special_tokens=False)
    user = tokenizer.encode((" " + suffix) if suffix else "", add_special_tokens=False)
    rng = random.Random(seed)
    room = num_tokens - len(head) - len(tail) - len(user)
    if room < 0:
        # Too short for the template: plain words, still exactly num_tokens.
        return tuple(rng.choice(filler) for _ in range(num_tokens))
    body = [rng.choice(filler) for _ in range(room)]
    return tuple(head + body + user + tail)
