"""The real engine: vLLM's LLMEngine in this process, stepped by one dedicated thread.

Why one thread: `LLMEngine.step()` is the only place tokens are made, so a thread that owns
the engine and calls `step()` in a loop sees exact step boundaries and can stamp every
token with the step that produced it.

Ownership: the step thread alone touches vLLM and the live-request table (the live half of
`_book`, engine/request_book.py). Callers reach it through a command queue: `stream()`
claims the request ID in the book's open streams, enqueues the request, and the step thread
registers it. When the thread ends (a shutdown, or the engine died) it fails every
live and every still-queued request, under the same lock `stream()` takes to enqueue, so
no request can slip in behind the last drain and wait forever. Events go back to each
consumer's asyncio loop in one `call_soon_threadsafe` per step, not one per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine.errors import EngineDied, KvscopeError, PromptTooLong, RequestRejected
from engine.events import (
    ChatMessage,
    EmulationInfo,
    EngineEvent,
    FinishReason,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    ProgressCallback,
    RequestWork,
    StepListener,
    StepSample,
    StepStarted,
    StepStartListener,
    TokenEvent,
    VllmTimings,
)
from engine.features import IN_PROCESS, EngineFeatures
from engine.listeners import Listeners, StepListeners
from engine.model_geometry import config_fields, read_attention_geometry
from engine.paths import engine_log_path
from engine.prompts import build_synthetic_prompt, chat_prompt_ids
from engine.request_book import (
    Item,
    LiveRequest,
    RequestBook,
    RequestTimes,
    check_prompt_length,
    idle_sample,
    prompt_fits,
)
from engine.sizes import dtype_bytes, kv_bytes_per_token
from engine.vllm.startup import (
    keep_workers_logging,
    map_start_error,
    read_geometry,
    route_vllm_logs,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from engine.vllm.internals import ScheduledWork


@dataclass(eq=False)
class _Live(LiveRequest):
    submitted_wall: float = 0.0  # stream() called, on the wall clock vLLM's arrival uses
    internal_id: str = ""
    vllm_stats: Any = None  # vLLM's RequestStateStats for this request
    vllm_token_ts: list[float] = field(default_factory=list)
    cached_tokens: int | None = None  # vLLM's prefix-cache hit for its prompt


class _Outbox:
    """Events of one step, grouped by consumer loop, handed over in one call per loop."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Item], Item]]]
        self._by_loop = defaultdict(list)

    def put(self, live: _Live, item: Item) -> None:
        assert live.loop is not None
        live.sent(item)
        self._by_loop[live.loop].append((live.queue, item))

    def put_token(self, live: _Live, token: TokenEvent) -> None:
        """`put` for a token, which never ends a request: no `sent` to note."""
        assert live.loop is not None
        self._by_loop[live.loop].append((live.queue, token))

    def flush(self) -> None:
        for loop, batch in self._by_loop.items():
            # A RuntimeError means the consumer's loop is gone: nobody is listening.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, batch)
        self._by_loop.clear()


def _deliver(batch: list[tuple[asyncio.Queue[Item], Item]]) -> None:
    for q, item in batch:
        q.put_nowait(item)


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
        self._start_listeners: Listeners[StepStarted] = Listeners()
        self._features = replace(IN_PROCESS, step_starts=self)
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        # Held while enqueueing a request and while the step thread declares itself gone.
        self._gate = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Open streams from any thread; live requests on the step thread only.
        self._book: RequestBook[_Live] = RequestBook()
        self._internal: dict[str, str] = {}  # vLLM's internal ID -> caller's ID
        # Live requests still before their first token: only they have a TTFT anatomy to
        # book a step into, so a step with none skips the walk over every live request.
        self._before_first: set[str] = set()
        # Each live request's last RequestWork, by internal ID: a decode step's work is the
        # same as the last step's, and a frozen one can be handed out again (hundreds of
        # requests a step at GPU scale).
        self._work: dict[str, RequestWork] = {}
        self._outbox = _Outbox()
        self._dead: str | None = None
        self._step = 0
        self._last_end = 0.0
        self._woke_at = 0.0
        # The callers' own tokenizer: vLLM's is used on the step thread, and a fast
        # tokenizer shared between threads raises "Already borrowed".
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._filler_ids: list[int] | None = None
        self._llm: Any = None  # vLLM's LLMEngine, see `_build`
        self._introspector: Any = None
        self._stat_logger: Any = None
        self._closed = False

    # -- life cycle -------------------------------------------------------------------------
    @property
    def card(self) -> ModelCard | None:
        return self._card

    @property
    def features(self) -> EngineFeatures:
        return self._features

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Load the model and start the step thread; blocks until ready or failed."""
        report = progress or (lambda _p: None)
        if self._thread is not None and self._thread.is_alive() and not self._dead and self._card:
            # Already running (a UI handed an engine that a test or script started).
            report(LoadProgress("ready", 1.0))
            return self._card
        if self._closed:
            # Shut down (the app quit) before this start got going: never build now.
            raise EngineDied("the engine was shut down")
        if self._thread is not None:
            self._stop_thread()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._stop.clear()
        self._dead = None
        self._step = 0
        self._last_end = 0.0
        self._woke_at = 0.0

        def main() -> None:
            try:
                self._build(report)
            except BaseException as exc:
                failure.append(exc)
                if self._llm is not None:  # built, then failed: free it all the same
                    with contextlib.suppress(Exception):
                        self._llm.engine_core.shutdown()
                    self._release()
                ready.set()
                return
            ready.set()
            self._run()

        thread = threading.Thread(target=main, name="kvscope-engine", daemon=True)
        self._thread = thread
        thread.start()
        ready.wait()
        if failure:
            # A shutdown() meanwhile may have joined it and cleared `_thread` already.
            thread.join(timeout=30)
            if self._thread is thread:
                self._thread = None
            raise failure[0]
        assert self._card is not None
        report(LoadProgress("ready", 1.0))
        return self._card

    def _build(self, report: ProgressCallback) -> None:
        """Build vLLM's engine into `self._llm`. Never into a local: vLLM keeps the
        exception of an optional import that failed while it was building (for instance
        `vllm.multimodal.media.audio` without torchcodec), and with it the frames of
        every caller, this one included, with their locals, for good."""
        # Must be set before vLLM reads its environment: the engine core then lives in
        # this process, where the scheduler and block pool can be read.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        route = route_vllm_logs(self.log_path)
        self._check_stop()
        report(LoadProgress("importing vLLM", 0.05))
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401  (import cost shows here)
        from vllm.v1.engine.llm_engine import LLMEngine

        from engine.vllm.internals import EngineIntrospector

        if self.engine_args is None:
            from engine.vllm.options import build_engine_settings

            def on_model(stage: str, fraction: float) -> None:
                report(LoadProgress(f"preparing model: {stage}", 0.05 + 0.1 * fraction))

            settings = build_engine_settings(self.argv or [], on_model)
            self.engine_args = settings.engine_args
            self.model_label = settings.model_label
        args = self.engine_args
        keep_workers_logging(args, route)
        geometry: dict[str, int] = {}
        try:
            self._check_stop()
            report(LoadProgress("reading model config", 0.15))
            geometry = read_geometry(str(args.model))
            self._check_stop()
            report(LoadProgress("loading weights and sizing the KV pool", 0.3))
            self._stat_logger = None
            self._llm = LLMEngine.from_engine_args(args, stat_loggers=[self._make_stat_logger])
        except BaseException as exc:
            self._cleanup_distributed()
            raise map_start_error(
                exc,
                model=str(args.model),
                max_model_len=args.max_model_len,
                kv_bytes_per_token=geometry.get("kv_bytes_per_token"),
                block_size=geometry.get("block_size") or args.block_size,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                log_path=route.path,
            ) from exc
        report(LoadProgress("reading the KV pool", 0.9))
        self._introspector = EngineIntrospector(self._llm)
        self._introspector.on_scheduled = self._step_began
        self._tokenizer = _own_tokenizer(self._llm)
        self._filler_ids = None
        self._card = self._make_card(self._llm)
        try:
            memory = self._introspector.memory_budget()
        except Exception:  # an accounting vLLM moved must not stop the engine
            logging.getLogger("vllm").exception("kvscope: no memory budget")
            memory = None
        self._features = replace(IN_PROCESS, step_starts=self, memory=memory)

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise EngineDied("the engine was shut down while it was starting")

    def _make_stat_logger(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from engine.vllm.stat_logger import KvscopeStatLogger

        self._stat_logger = KvscopeStatLogger(vllm_config, engine_index)
        return self._stat_logger

    def _make_card(self, engine: Any) -> ModelCard:
        cfg = engine.vllm_config
        mc = cfg.model_config
        geo = read_attention_geometry(config_fields(mc.hf_text_config))
        layers, kv_heads, head_dim = geo.num_layers, geo.num_kv_heads, geo.head_dim
        dtype = str(mc.dtype).replace("torch.", "")
        elem = dtype_bytes(dtype, str(cfg.cache_config.cache_dtype))
        from vllm.platforms import current_platform

        return ModelCard(
            name=self.model_label,
            path=str(mc.model),
            dtype=dtype,
            num_layers=layers,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            kv_bytes_per_token=kv_bytes_per_token(layers, kv_heads, head_dim, elem),
            max_model_len=int(mc.max_model_len),
            block_size=self._introspector.block_size,
            total_blocks=self._introspector.total_blocks,
            kv_groups=self._introspector.kv_groups,
            kv_capacity_tokens=self._introspector.kv_capacity_tokens,
            device=str(current_platform.device_type),
            emulation=self.emulation,
            parallel=_parallel_layout(cfg.parallel_config),
            scheduling=scheduling_words(
                self._introspector.async_scheduling,
                self._introspector.batch_queue_depth,
                on_cpu=current_platform.is_cpu(),
            ),
            exact_steps=self.features.exact_steps,  # for a tape, which keeps the card
        )

    def shutdown(self) -> None:
        """Stop the step thread, fail whatever is still live, free the engine; for good
        (a start() afterwards refuses). Safe to call more than once, from any thread."""
        self._closed = True
        self._stop.set()  # a start-up in progress stops at its next stage
        self._stop_thread()

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._commands.put(("wake", None))
        # The step thread fails what is live and frees vLLM on its way out; an
        # interpreter that exits under a thread still inside native code aborts (exit 134).
        thread.join()
        self._thread = None

    def _cleanup_distributed(self) -> None:
        # A second engine in the same process (restart after a failure) needs vLLM's
        # process-wide distributed state torn down first.
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except Exception:
            pass

    # -- the step thread ---------------------------------------------------------------------
    def _run(self) -> None:
        engine = self._llm
        try:
            intro = self._introspector
            while not self._stop.is_set():
                # A batch still in vLLM's queue is work too (see `batches_queued`).
                busy = engine.has_unfinished_requests() or intro.batches_queued > 0
                self._drain(engine, block=not busy)
                if self._stop.is_set():
                    break
                if engine.has_unfinished_requests() or intro.batches_queued > 0:
                    self._one_step(engine)
        except BaseException as exc:  # the engine is unusable now; say why to everyone
            lines = str(exc).strip().splitlines()
            self._close(f"{type(exc).__name__}: {lines[0][:200] if lines else ''}")
            logging.getLogger("vllm").exception("kvscope: engine step failed")
        else:
            self._close(None)
        finally:
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()
            # Nothing of kvscope's may keep vLLM's engine core, and with it the weights
            # and the KV pool (on a GPU a restart in this process would then fail vLLM's
            # free-memory check, naming this process as the one holding the GPU).
            self._release()
            del engine
            gc.collect()
            self._cleanup_distributed()

    def _release(self) -> None:
        """Drop every reference kvscope holds into vLLM's engine: the engine itself, the
        introspector (the core, its scheduler and pool, the wrappers put on them), the
        stat logger."""
        self._llm = None
        intro = self._introspector
        if intro is not None:
            intro.release()
        self._introspector = None
        self._stat_logger = None

    def _close(self, cause: str | None) -> None:
        """Fail every live and every still-queued request; later `stream()`s raise."""
        with self._gate:
            self._dead = cause or "the engine was shut down"
            error = EngineDied(self._dead)
            for live in self._book.end_all():
                self._outbox.put(live, error)
            self._before_first.clear()
            self._work.clear()
            while True:
                try:
                    kind, payload = self._commands.get_nowait()
                except queue.Empty:
                    break
                if kind == "add":
                    self._outbox.put(payload, error)
            self._outbox.flush()

    def _drain(self, engine: Any, *, block: bool) -> None:
        while True:
            try:
                kind, payload = (
                    self._commands.get(timeout=0.5) if block else (self._commands.get_nowait())
                )
            except queue.Empty:
                return
            if block:
                # Idle until now: no batch that comes out later ran before this moment.
                self._woke_at = time.perf_counter()
            block = False
            if kind == "add":
                self._add(engine, payload)
            elif kind == "abort":
                self._abort(engine, payload)
            elif kind == "call":  # a test's hook: run on the step thread, between steps
                payload(engine)
            self._outbox.flush()

    def _add(self, engine: Any, live: _Live) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        rid = live.request_id  # no other live request has it: stream() claimed it
        sp = live.request.sampling
        # Anything one request carries may be refused by vLLM: that ends this request
        # alone, never the step loop.
        try:
            params = SamplingParams(
                max_tokens=sp.max_tokens,
                temperature=sp.temperature,
                ignore_eos=sp.ignore_eos,
                seed=sp.seed,
                output_kind=RequestOutputKind.DELTA,
            )
            # vLLM marks the other keys NotRequired via typing_extensions, which mypy's
            # Python 3.10 mode reads as required.
            prompt = TokensPrompt(prompt_token_ids=list(live.prompt_ids))  # type: ignore[typeddict-item]
            internal = engine.add_request(rid, prompt, params)
        except Exception as exc:
            self._outbox.put(live, refusal(rid, exc, len(live.prompt_ids), self._card))
            return
        live.internal_id = str(internal)
        live.vllm_stats = self._introspector.request_stats(live.internal_id)
        self._book.add(live)
        self._internal[live.internal_id] = rid
        self._before_first.add(rid)
        self._outbox.put(live, live.accepted())

    def _abort(self, engine: Any, rid: str) -> None:
        live = self._book.get(rid)
        if live is None or live.done:
            return
        engine.abort_request([rid])
        self._finish(live, "abort", time.perf_counter())
        self._maybe_idle(engine)

    def _finish(self, live: _Live, reason: FinishReason, now: float) -> None:
        timings = self._vllm_timings(live)
        done = self._book.finish(live, reason, now, vllm=timings)
        if live.cached_tokens is not None:
            done = replace(done, cached_prompt_tokens=live.cached_tokens)
        self._outbox.put(live, done)
        self._internal.pop(live.internal_id, None)
        self._before_first.discard(live.request_id)
        self._work.pop(live.internal_id, None)

    def _one_step(self, engine: Any) -> None:
        called = time.perf_counter()
        outputs = engine.step()
        ended = time.perf_counter()
        intro = self._introspector
        work = intro.take_scheduled()
        if (
            work is None
            or not work.number
            or not any(i in self._internal for i in work.per_request)
        ):
            # No step to show: a call that only scheduled (batches in flight), a batch with
            # nothing to run, or one whose every request ended while it was in flight (a
            # reply that stopped on EOS leaves one batch so, with async scheduling). Its
            # number stays taken: its start may have been announced.
            if work is not None:
                self._step = max(self._step, work.number)
            self._hand_out(engine, outputs, ended)
            return
        self._step = work.number
        # A batch kept in flight ran from when it was scheduled, not from this call: count
        # it from then, but never from before the last step's end, so steps never overlap,
        # nor from before the step loop last woke from idle, so no step spans a pause.
        # In lockstep the batch is scheduled inside this call, and this is `called`.
        started = min(called, max(work.scheduled_at, self._last_end, self._woke_at))
        self._last_end = ended
        preempted = tuple(
            self._internal[i] for i in work.preempted_internal_ids if i in self._internal
        )
        per_request = self._request_work(work.per_request)
        if self._before_first:
            total_tokens = work.prefill_tokens + work.decode_tokens
            own_prefill = {w.request_id: w.prefill_tokens for w in per_request}
            self._book.book_step(started, ended, own_prefill, total_tokens, set(preempted))
        for rid in preempted:
            victim = self._book.get(rid)
            if victim is not None:
                victim.preemptions += 1
        # The blocks first: with a batch in flight they say what the counts below leave out.
        blocks = intro.live_blocks(self._internal)
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
            blocks=blocks,
            preemptions=len(preempted),
            preempted_ids=preempted,
            work=per_request,
            waiting_ids=tuple(
                self._internal[i] for i in work.waiting_internal_ids if i in self._internal
            ),
            block_cache=intro.block_cache(),
            perf=work.perf,
        )
        # Listeners first: a consumer that stops listening when its request finishes
        # must still see the step that finished it.
        self._listeners.emit(sample)
        self._hand_out(engine, outputs, ended)

    def _request_work(self, scheduled: dict[str, tuple[int, int]]) -> tuple[RequestWork, ...]:
        """Each of kvscope's scheduled requests' share of the step, by the caller's IDs."""
        internal, known = self._internal, self._work
        out = []
        for i, (p, d) in scheduled.items():
            rid = internal.get(i)
            if rid is None:
                continue
            w = known.get(i)
            if w is None or w.prefill_tokens != p or w.decode_tokens != d:
                w = known[i] = RequestWork(rid, p, d)
            out.append(w)
        return tuple(out)

    def _hand_out(self, engine: Any, outputs: Any, ended: float) -> None:
        """The step's new tokens and finished requests to their streams."""
        # Once a request a step, hundreds of requests at GPU scale: names looked up once.
        get, put_token, step = self._book.get, self._outbox.put_token, self._step
        for out in outputs:
            # vLLM 0.32's outputs carry the caller's ID; its scheduler uses an internal one.
            live = get(out.request_id)
            if live is None or live.done or not out.outputs:
                continue
            completion = out.outputs[0]
            cached = out.num_cached_tokens
            if cached is not None and cached != live.cached_tokens:
                live.cached_tokens = int(cached)
            new_ids = tuple(completion.token_ids)
            if new_ids:
                if not live.times.token_times:
                    self._before_first.discard(live.request_id)
                # Stamped with the step's end: the moment vLLM made them.
                token = live.times.token(new_ids, completion.text, step=step, at=ended)
                put_token(live, token)
                stats = live.vllm_stats
                if stats is not None:
                    at = float(stats.last_token_ts)
                    if len(new_ids) == 1:
                        live.vllm_token_ts.append(at)
                    else:
                        live.vllm_token_ts.extend([at] * len(new_ids))
            if out.finished:
                reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
                self._finish(live, reason, ended)
        self._outbox.flush()
        self._maybe_idle(engine)

    def _step_began(self, work: ScheduledWork) -> None:
        # On the step thread, inside vLLM's step(), between scheduling and the model run.
        if not self._start_listeners or not (work.prefill_tokens + work.decode_tokens):
            return
        intro = self._introspector
        self._start_listeners.emit(intro.started(work, self._internal, work.number))

    def _maybe_idle(self, engine: Any) -> None:
        """Once the last request is gone, say so with one sample of the pool as it is."""
        # vLLM may still count a just-finished request until its next step cleans up, but
        # its blocks are already free: kvscope's own table says whether anything is live.
        if not self._book.went_idle():
            return
        intro = self._introspector
        sample = idle_sample(
            step=self._step,
            at=time.perf_counter(),
            running=intro.num_running(),
            waiting=intro.num_waiting(),
            kv_usage=intro.usage(),
            free_blocks=intro.free_blocks(),
            total_blocks=intro.total_blocks,
            block_size=intro.block_size,
        )
        # What the last request left in the prefix cache stays on the map as cached.
        self._listeners.emit(replace(sample, block_cache=intro.block_cache()))

    def _vllm_timings(self, live: _Live) -> VllmTimings | None:
        stats = live.vllm_stats
        if stats is None:
            return None
        done = self._stat_logger.take(live.internal_id) if self._stat_logger else None
        ts = live.vllm_token_ts
        return VllmTimings(
            ttft_s=float(stats.first_token_latency) if ts else None,
            itl_s=tuple(b - a for a, b in itertools.pairwise(ts)),
            queue_s=done.queue_s if done else None,
            prefill_s=done.prefill_s if done else None,
            kvscope_queue_s=max(0.0, float(stats.arrival_time) - live.submitted_wall),
        )

    # -- the protocol --------------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def add_step_start_listener(self, listener: StepStartListener) -> Callable[[], None]:
        return self._start_listeners.add(listener)

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """Submit `request` and yield its events (see the Engine protocol). Its clock starts
        now; the request is checked and queued once the stream is first read."""
        submitted_at = time.perf_counter()  # the caller's clock: queueing here counts
        submitted_wall = time.time()

        def submit() -> _Live:
            return self._submit(request, submitted_at, submitted_wall)

        # The book's own generator, with no second one around it: a layer is one more
        # generator step per token on the consumer's loop, beside the step (issue 30).
        return self._book.stream(request.request_id, submit, self.abort)

    def _submit(
        self, request: GenerationRequest, submitted_at: float, submitted_wall: float
    ) -> _Live:
        """On the consumer's loop, once the request ID is claimed: the request checked and
        queued for the step thread. Raises EngineDied or PromptTooLong."""
        card = self._card
        if self._dead:
            raise EngineDied(self._dead)
        if self._thread is None or card is None:
            raise EngineDied("the engine is not running")
        if request.prompt_token_ids is not None:
            ids = tuple(request.prompt_token_ids)
        else:
            ids = self.chat_prompt_ids(request.messages)
        check_prompt_length(len(ids), card.max_model_len)
        rid = request.request_id
        live = _Live(
            request,
            RequestTimes.stepped(rid, submitted_at),
            ids,
            asyncio.get_running_loop(),
            submitted_wall=submitted_wall,
        )
        with self._gate:
            if self._dead:
                raise EngineDied(self._dead)
            self._commands.put(("add", live))
        return live

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineDied("the engine is not running")
        return self._tokenizer

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        tok = self._require_tokenizer()
        with self._tokenizer_lock:
            return chat_prompt_ids(tok, messages)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        tok = self._require_tokenizer()
        with self._tokenizer_lock:
            return build_synthetic_prompt(tok, num_tokens, suffix, seed, cache=self)

    @property
    def introspection(self) -> Any:
        """The vLLM internals reader, for tests only."""
        return self._introspector


def refusal(
    rid: str, exc: BaseException, prompt_tokens: int, card: ModelCard | None
) -> KvscopeError:
    """What vLLM's refusal of one request means, in kvscope's errors."""
    import re

    text = str(exc)
    said = re.search(r"maximum (?:context|model) length (?:is|of) (\d+)", text)
    if said:
        return PromptTooLong(prompt_tokens, int(said.group(1)))
    if card is not None and not prompt_fits(prompt_tokens, card.max_model_len):
        return PromptTooLong(prompt_tokens, card.max_model_len)
    first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    return RequestRejected(rid, first)


def scheduling_words(async_on: bool, depth: int, *, on_cpu: bool) -> str:
    """The model card's line on how steps relate to batches (see docs/gpu.md, "What differs on a
    GPU"): each step's sample describes the batch whose tokens it hands out, in any mode."""
    if async_on:
        return f"async scheduling on: {depth} batches in flight, tokens a step behind"
    off = (
        "async scheduling off (the CPU backend turns it off)"
        if on_cpu
        else ("async scheduling off")
    )
    if depth > 1:
        return f"{off}; {depth} batches in flight (pipeline parallel)"
    return off


def _parallel_layout(pc: Any) -> str:
    """ "TP 2 x PP 1 x DP 1 (mp)" when vLLM spreads the model over devices; "" on one."""
    tp = int(getattr(pc, "tensor_parallel_size", 1))
    pp = int(getattr(pc, "pipeline_parallel_size", 1))
    dp = int(getattr(pc, "data_parallel_size", 1))
    if tp * pp * dp == 1:
        return ""
    backend = getattr(pc, "distributed_executor_backend", None)
    how = f" ({backend})" if isinstance(backend, str) else ""
    return f"TP {tp} x PP {pp} x DP {dp}{how}"


def _own_tokenizer(engine: Any) -> Any:
    """A tokenizer for the callers' threads, separate from the one vLLM uses."""
    mc = engine.vllm_config.model_config
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            mc.tokenizer, trust_remote_code=bool(mc.trust_remote_code)
        )
    except Exception:
        import copy

        return copy.deepcopy(engine.get_tokenizer())
