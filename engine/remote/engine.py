"""RemoteEngine: kvscope's Engine protocol on a running vLLM server.

Three channels, each on its own thread, none needing vLLM, torch or a GPU here:
- requests stream over the OpenAI API (httpx on one asyncio loop thread, so token arrival
  times do not depend on how busy the consumer's loop is): this module;
- engine state comes from Prometheus /metrics, scraped about 5 times a second;
- the prefix-cache index comes from vLLM's KV events (ZMQ), when the server publishes them.
The last two watch the server rather than drive it: the engine's ServerWatch
(server_watch.py) holds them, and the engine hands its scrapes, cache and capabilities on.

What a remote engine cannot show, it says (`capabilities`): there are no step boundaries
(engine samples are scrapes), no physical block IDs (blocks are known by hash), and tokens
carry the time they reached this client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx

from engine.errors import (
    AuthRequired,
    BadOption,
    ConnectionLost,
    EngineDied,
    EngineStartFailed,
    KvscopeError,
    PromptTooLong,
    RequestRejected,
)
from engine.events import (
    ChatMessage,
    EngineEvent,
    GenerationRequest,
    LoadProgress,
    ModelCard,
    PrefixCacheView,
    ProgressCallback,
    RemoteCapabilities,
    ScrapeListener,
    ScrapeSample,
    StepListener,
    TokenEvent,
)
from engine.features import REMOTE_DEVICE_PREFIX, EngineFeatures
from engine.remote.client import (
    EventTooLarge,
    ServerAnswer,
    ServerClient,
    ServerUrl,
    SseDecoder,
    answer_words,
    auth_headers,
    describe,
    error_message,
    json_value,
    parse_server_url,
    parse_too_long,
    resolve_api_key,
    transport_failure,
)
from engine.remote.prompts import PromptTokenizer, RemotePrompts, ServerTokenizer
from engine.remote.relay import Relay
from engine.remote.server_api import VLLM_API, ContextSource, ServerApi
from engine.remote.server_watch import ServerWatch
from engine.remote.streaming import ReplyAssembler, StreamError
from engine.remote.timeouts import DEFAULT_TIMEOUTS, ServerStalled, Timeouts, Wait, Watchdog
from engine.remote.transport import LeanAnswer, LeanPoster, LeanTransport, lean_transport_fits
from engine.request_book import (
    Item,
    LiveRequest,
    RequestBook,
    RequestTimes,
    check_prompt_length,
)
from engine.visible_text import visible

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence

    from engine.remote.client_tokenizer import ClientTokenizer
    from engine.remote.metrics import CacheInfo

log = logging.getLogger("kvscope")

UNKNOWN_FIELDS = ("dtype", "num_layers", "num_kv_heads", "head_dim", "kv_bytes_per_token")
# httpx's transport (https, proxies): no limit on connections (httpx's default of 100
# would queue every stream past the 100th), and idle ones kept for the next requests.
STREAM_POOL = httpx.Limits(max_connections=None, max_keepalive_connections=32)
# Answers to vLLM's chat form of /tokenize from a server that does not have it: no such
# path, no such method, a body it does not take (GuideLLM's mock: 400), not implemented.
NOT_VLLM_TOKENIZE = frozenset({400, 404, 405, 415, 422, 501})
# No model has a context near this; a claim past it is a lie or a bug, not a length.
MAX_CLAIMED_CONTEXT = 2**40


@dataclass(frozen=True)
class WholeAnswer:
    """A request's answer not streamed: its JSON, and when it was sent and answered
    (time.perf_counter, on the engine's IO loop)."""

    data: dict[str, Any]
    sent_at: float
    answered_at: float


@dataclass(eq=False)
class _Live(LiveRequest):
    session_id: str = ""
    future: concurrent.futures.Future[None] | None = None
    relay: Relay | None = None  # to the consumer's loop, shared by its requests
    extra_body: Mapping[str, Any] | None = None  # fields added to the request's JSON

    def put_threadsafe(self, item: Item) -> None:
        if self.relay is None:
            super().put_threadsafe(item)
            return
        if type(item) is not TokenEvent:  # a token never ends a request: once a token,
            self.sent(item)  # its isinstance check was 3 % of the IO thread's CPU
        self.relay.put(self.queue, item)


class _ReplyReader:
    """One streamed reply, read by read on the IO loop: its SSE events, their JSON, and
    the events that come of them handed to the consumer, each with the time its read
    arrived. `on_read` says True once the reply's `[DONE]` came."""

    def __init__(
        self, live: _Live, reply: ReplyAssembler, between_chunks_s: float, watch: ServerWatch
    ) -> None:
        self.live, self.reply, self.watch = live, reply, watch
        self.timer: Watchdog | None = None  # the request's, once it is sent
        self.between_chunks_s = between_chunks_s
        self.decoder = SseDecoder()
        self.reads = 0  # a stall after the first is one "between chunks"

    def on_read(self, raw: bytes, arrived: float) -> bool:
        self.reads += 1
        if self.timer is not None:
            self.timer.reschedule(self.between_chunks_s)
        live, reply = self.live, self.reply
        for data in self.decoder.feed(raw):
            if data[:1] != "{" and data.strip() == "[DONE]":  # a chunk is an object
                # Said before the finish is handed on: whoever reads the finish may ask
                # at once (a race seen under a busy loop).
                self.watch.server_timings = reply.metrics is not None
                live.put_threadsafe(reply.finish(time.perf_counter()))
                return True
            chunk = json_value(data)
            if not isinstance(chunk, dict):
                raise TypeError(f"a chunk of type {type(chunk).__name__}, not an object")
            for event in reply.on_chunk(chunk, arrived):
                live.put_threadsafe(event)
        return False


class RemoteEngine:
    """A running `vllm serve` behind kvscope's Engine protocol.

    `url` is the server's root (`http://host:8000`; a trailing `/v1` is fine). The API key
    is `api_key`, else VLLM_API_KEY, else OPENAI_API_KEY; credentials in the URL itself
    (`http://user:password@host`) are sent as Basic auth instead, and are never part of
    `url` once it is parsed. `timeouts` bounds every wait on the server (see
    engine/remote/timeouts.py). `kv_events` is "auto" (ask the
    server's /kv_event_sources), None (off), or the endpoint the server was given in
    `--kv-events-config` (a wildcard one is reached at the server's host; a concrete
    tcp address is bound here, because vLLM's PUB socket connects to it).

    A server that is not vLLM's (no vLLM `/tokenize`) is measured too (server_api.py):
    prompts are counted by `tokenizer` (default: the served model's own, if this machine
    has it) and sent as text, and its context limit is `max_model_len` when it does not
    say one.
    """

    remote = True

    def __init__(
        self,
        url: str | ServerUrl,
        *,
        api_key: str | None = None,
        served_model_name: str | None = None,
        kv_events: str | None = "auto",
        metrics_path: str = "/metrics",
        scrape_interval_s: float = 0.2,
        verify: bool | str = True,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        session_id: str | None = None,
        report_cache_hits: bool = True,
        tokenizer: str | None = None,
        max_model_len: int | None = None,
    ) -> None:
        where = url if isinstance(url, ServerUrl) else parse_server_url(url)
        if where.authorization and api_key:
            raise BadOption(
                "--api-key",
                "the --url carries a user and password too, and both would be the "
                "Authorization header: give one of them",
            )
        self._where = where
        self.url = where.root  # never the credentials: this is printed and written
        # A key in the environment does not beat credentials written into the URL.
        self.api_key = None if where.authorization else resolve_api_key(api_key)
        self.served_model_name = served_model_name
        self.kv_events_setting = kv_events
        self.metrics_path = metrics_path
        self.scrape_interval_s = scrape_interval_s
        self.verify = verify
        self.timeouts = timeouts
        self.report_cache_hits = report_cache_hits
        self.tokenizer_name = tokenizer
        self.max_model_len_given = max_model_len
        self.api: ServerApi = VLLM_API  # known for sure once attached
        self._client_tokenizer: ClientTokenizer | None = None
        self.session_id = session_id or self._new_session_name()
        self.model = ""
        self.attachments = 0  # times attached: 1 after start(), +1 per re-attach
        self._card: ModelCard | None = None
        # The server watched beside the requests: /metrics, KV events, what can be shown.
        self._watch = ServerWatch(self.url, on_pool=self._pool_changed, on_back=self._reattach)
        self._control: ServerClient | None = None
        self._prompts: RemotePrompts | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None
        self._lean: LeanPoster | None = None  # plain http: streams skip httpx's client
        # Only open streams: the server, not this client, runs the requests.
        self._book: RequestBook[_Live] = RequestBook()
        self._sessions: dict[str, str] = {}  # request ID -> session ID
        self._lock = threading.Lock()
        self._said_not_unicode = False  # lone surrogates in a reply: said once (_run)
        # One relay per consumer loop; a loop that is gone takes its relay with it.
        self._relays: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Relay] = (
            weakref.WeakKeyDictionary()
        )

    # -- life cycle -------------------------------------------------------------------------
    @property
    def card(self) -> ModelCard | None:
        return self._card

    @property
    def features(self) -> EngineFeatures:
        # Samples are /metrics scrapes: no step boundaries, no block IDs, no per-step split.
        return EngineFeatures(exact_steps=False, remote=self)

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Attach: list models, read the KV pool from /metrics, open the three channels.

        Raises ServerUnreachable (naming the URL) or AuthRequired; safe to call again to
        retry after a failure.
        """
        report = progress or (lambda _p: None)
        self.shutdown()
        report(LoadProgress(f"connecting to {self.url}", 0.1))
        control = self._client()
        try:
            model, served_len, root = self._pick_model(control)
            report(LoadProgress("reading the KV pool from /metrics", 0.3))
            state = self._watch.read_pool(control, model, self.metrics_path)
            report(LoadProgress("asking which API the server speaks", 0.4))
            tokenizer = self._tokenizer_for(control, model, root, report)
            max_len, context = self._context(served_len)
            self.model = model
            self._card = self._make_card(model, max_len, root)
            self._control = control
            self._prompts = RemotePrompts(tokenizer)
            client = self._client_tokenizer
            self.api = (
                VLLM_API if client is None else ServerApi(False, context, client.name, client.note)
            )
            self._watch.api_notes = self.api.notes()
        except BaseException:
            control.close()
            raise
        report(LoadProgress("subscribing to KV events", 0.7))
        self._watch.follow_kv_events(control, self.kv_events_setting)
        report(LoadProgress("opening the request and metrics channels", 0.85))
        self._start_loop()
        self._watch.start_scraping(
            state, self._client(self.timeouts.scrape()), self.scrape_interval_s
        )
        self.attachments += 1
        report(LoadProgress("ready", 1.0))
        return self._card

    def _client(self, timeout: httpx.Timeout | None = None) -> ServerClient:
        return ServerClient(
            self._where, self.api_key, verify=self.verify, timeouts=self.timeouts, timeout=timeout
        )

    def _tokenizer_for(
        self, control: ServerClient, model: str, root: str, report: ProgressCallback
    ) -> PromptTokenizer:
        """vLLM's /tokenize when the server answers it in vLLM's chat form; else one here."""
        server = ServerTokenizer(control, model)
        try:
            server.chat_ids([{"role": "user", "content": "x"}])
        except ServerAnswer as exc:
            if exc.status not in NOT_VLLM_TOKENIZE:
                raise EngineStartFailed(f"{self.url}/tokenize answered {exc.words}") from exc
            # No such path, or not vLLM's form of it: not vLLM. (A 200 with no token IDs
            # in it is a vLLM server gone wrong, and is said as such by chat_ids.)
        else:
            self._client_tokenizer = None  # the server's own count beats any guess here
            return server
        from engine.remote.client_tokenizer import ClientTokenizer

        # transformers' import and a tokenizer's files take seconds (tens on a busy host):
        # said, so the screen does not sit on the question above.
        wanted = self.tokenizer_name or model
        report(LoadProgress(f"not vLLM: loading a tokenizer here ({wanted})", 0.5))
        self._client_tokenizer = ClientTokenizer.load(self.tokenizer_name, (root, model))
        return self._client_tokenizer

    def _context(self, served: int | None) -> tuple[int, ContextSource]:
        """The context limit and where it came from; 0 when nobody says (no wall drawn)."""
        if served is not None:
            given = self.max_model_len_given
            if given and given != served:
                raise BadOption(
                    "--max-model-len",
                    f"the server says its own max_model_len ({served:,}); the flag is for a "
                    "server that does not say one (to limit vLLM's, start it with the flag)",
                )
            return served, "server"
        if self.max_model_len_given:
            return self.max_model_len_given, "flag"
        return 0, "unknown"

    def _pick_model(self, control: ServerClient) -> tuple[str, int | None, str]:
        try:
            models = control.models()
        except ServerAnswer as exc:
            raise EngineStartFailed(f"{self.url}/v1/models answered {exc.words}") from exc
        if not models:
            raise EngineStartFailed(f"the server at {self.url} serves no model")
        for m in models:
            if not isinstance(m.get("id"), str) or not m["id"]:
                raise EngineStartFailed(
                    f"{self.url}/v1/models lists a model with no id (it gives "
                    f"{', '.join(sorted(map(str, m))) or 'nothing'}); is this a vLLM server?"
                )
        names = [str(m["id"]) for m in models]
        if self.served_model_name:
            if self.served_model_name not in names:
                raise BadOption(
                    "--served-model-name",
                    f"the server at {self.url} serves {', '.join(names)}, not "
                    f"{self.served_model_name}",
                )
            chosen = models[names.index(self.served_model_name)]
        else:
            chosen = models[0]
        max_len = chosen.get("max_model_len")
        if max_len is not None and (
            not isinstance(max_len, int)
            or isinstance(max_len, bool)
            or not 0 < max_len <= MAX_CLAIMED_CONTEXT
        ):
            raise EngineStartFailed(
                f"{self.url}/v1/models gives max_model_len {json.dumps(max_len)[:40]}, not a "
                f"context length (a whole number of tokens from 1 to {MAX_CLAIMED_CONTEXT:,})"
            )
        root = chosen.get("root")
        return str(chosen["id"]), max_len, root if isinstance(root, str) and root else chosen["id"]

    def _make_card(self, model: str, max_len: int, root: str) -> ModelCard:
        cache = self._watch.cache
        unknown = list(UNKNOWN_FIELDS)
        if not max_len:
            unknown.append("max_model_len")
        if cache is None:
            unknown += ["block_size", "total_blocks"]
        return ModelCard(
            name=visible(model),  # shown on screen; requests name `model` as the server does
            path=visible(root),
            dtype="unknown",
            num_layers=0,
            num_kv_heads=0,
            head_dim=0,
            kv_bytes_per_token=0,
            max_model_len=max_len,
            block_size=cache.block_size if cache else 0,
            total_blocks=cache.total_blocks if cache else 0,
            device=f"{REMOTE_DEVICE_PREFIX}{self.url}",
            unknown=tuple(unknown),
            exact_steps=self.features.exact_steps,  # for a tape, which keeps the card
        )

    def shutdown(self) -> None:
        """Close every channel; requests still streaming end as aborted."""
        self._watch.stop()
        loop, thread = self._loop, self._loop_thread
        if loop is not None and thread is not None:
            for live in self._book.open_streams():
                if live.future is not None:
                    live.future.cancel()
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close_http(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
        self._loop = None
        self._loop_thread = None
        self._http = None
        self._lean = None
        if self._control is not None:
            self._control.close()
            self._control = None

    # -- the request channel: one asyncio loop thread ------------------------------------------
    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="kvscope-remote-io", daemon=True)
        thread.start()
        self._loop, self._loop_thread = loop, thread

        async def make() -> httpx.AsyncClient:
            # Plain http gets the lean transport (a few µs a chunk, see transport.py);
            # https and proxies keep httpx's own. Neither limits connections: a stream
            # queued in the client's pool would be counted as the server's TTFT.
            # Streams over it go through a LeanPoster: no httpx client per request.
            lean = LeanTransport() if lean_transport_fits(self.url) else None
            http = httpx.AsyncClient(
                base_url=self.url,
                headers=auth_headers(self.api_key, self._where.authorization),
                verify=self.verify,
                timeout=self.timeouts.streaming(),
                limits=STREAM_POOL,
                transport=lean,
            )
            self._lean = LeanPoster(http, lean) if lean is not None else None
            return http

        self._http = asyncio.run_coroutine_threadsafe(make(), loop).result(timeout=30)

    async def _close_http(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
        # httpx's own layers leave an async generator a stream behind (closed by the
        # loop when collected): close them now, while the loop still runs their aclose.
        await asyncio.get_running_loop().shutdown_asyncgens()

    def stream(
        self,
        request: GenerationRequest,
        *,
        submitted_at: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[EngineEvent]:
        """Send `request`; its clock starts now, when stream() is called, or at
        `submitted_at` (time.perf_counter) for a request whose earlier part ran elsewhere (a
        disaggregated prefill: engine/fleet/disaggregated.py). `extra_body`: fields added to
        the request's JSON (vLLM's `kv_transfer_params`)."""
        began = time.perf_counter() if submitted_at is None else submitted_at

        def submit() -> _Live:
            return self._submit(request, began, extra_body)

        # The book's own generator, with no second one around it: a layer costs a
        # generator step per token, hundreds of streams at once.
        return self._book.stream(request.request_id, submit, self.abort)

    def _submit(
        self,
        request: GenerationRequest,
        submitted_at: float,
        extra_body: Mapping[str, Any] | None,
    ) -> _Live:
        """On the consumer's loop, once the request ID is claimed: the request checked and
        sent to the IO loop. Raises EngineDied (not attached) or PromptTooLong."""
        loop = self._loop
        card = self._card
        if loop is None or card is None:
            raise EngineDied("the remote engine is not attached; call start() first")
        ids = request.prompt_token_ids
        if ids is not None:
            # The server's rule, checked here: it costs no round trip.
            check_prompt_length(len(ids), card.max_model_len)
        rid = request.request_id
        consumer = asyncio.get_running_loop()
        live = _Live(
            request,
            RequestTimes(rid, submitted_at),
            loop=consumer,
            session_id=self.session_id,
            relay=self._relay(consumer),
            extra_body=extra_body,
        )
        with self._lock:
            self._sessions[rid] = live.session_id
        live.future = asyncio.run_coroutine_threadsafe(self._run(live), loop)
        return live

    def _relay(self, consumer: asyncio.AbstractEventLoop) -> Relay:
        with self._lock:
            relay = self._relays.get(consumer)
            if relay is None:
                relay = self._relays[consumer] = Relay(consumer)
            # Every put is made on the IO loop (RemoteEngine._run), the one of this attach.
            relay.producer = self._loop
            return relay

    def _body(
        self, req: GenerationRequest, session_id: str, extra: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        path, body = self._fields(req, session_id)
        if extra:
            body.update(extra)
        return path, body

    def _fields(self, req: GenerationRequest, session_id: str) -> tuple[str, dict[str, Any]]:
        sp = req.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
        }
        client = self._client_tokenizer
        if client is not None:
            # The OpenAI API's fields only: other servers refuse vLLM's (OpenAI does).
            if sp.seed is not None:
                body["seed"] = sp.seed
            if req.prompt_token_ids is not None:
                body["prompt"] = client.text(req.prompt_token_ids)
                return "/v1/completions", body
            body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
            return "/v1/chat/completions", body
        body["return_token_ids"] = True
        body["session_id"] = session_id
        if sp.ignore_eos:
            body["ignore_eos"] = True
        if sp.seed is not None:
            body["seed"] = sp.seed
        if self.report_cache_hits:
            # Prefix-cache hits are then reported as BlockStored under this session too.
            body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
        if req.prompt_token_ids is not None:
            body["prompt"] = list(req.prompt_token_ids)
            return "/v1/completions", body
        body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
        return "/v1/chat/completions", body

    async def _run(self, live: _Live) -> None:
        """On the IO loop: one request from POST to RequestFinished (or a typed error).

        Every wait is bounded (see Timeouts): the first byte of the body within
        first_byte_s of the request, each later read within between_chunks_s of the last.
        """
        rid = live.request.request_id
        ids = live.request.prompt_token_ids
        client = self._client_tokenizer
        if ids is None and client is not None:
            # A chat: counted here, with the chat template, as the server cannot say.
            chat = [{"role": m.role, "content": m.content} for m in live.request.messages]
            ids = tuple(client.chat_ids(chat))
        reply = ReplyAssembler(
            live.times, len(ids) if ids is not None else None, server_counts=client is None
        )
        path, body = self._body(live.request, live.session_id, live.extra_body)
        http, lean = self._http, self._lean
        assert http is not None
        limits = self.timeouts
        reader = _ReplyReader(live, reply, limits.between_chunks_s, self._watch)
        answered = False
        try:
            async with (
                Watchdog(limits.first_byte_s) as timer,
                lean.post(path, body) if lean else http.stream("POST", path, json=body) as response,
            ):
                answered = True
                if response.status_code != 200:
                    raise await self._refusal(live.request, response)
                accepted = reply.accept()  # token prompts: the length is known already
                if accepted is not None:
                    live.put_threadsafe(accepted)
                reader.timer = timer
                on_read = reader.on_read
                # A body with no Content-Encoding (vLLM's) is read raw: no decoder layer.
                plain = response.headers.get("content-encoding", "identity") == "identity"
                if plain and isinstance(response, LeanAnswer):
                    # Each read handed on where it arrives: no task woken per token.
                    if await response.deliver(on_read):
                        return
                else:
                    # Closed here, not when collected: by then the IO loop may be gone.
                    # (It is an async generator; httpx's annotation says only
                    # AsyncIterator.)
                    data_in = response.aiter_raw() if plain else response.aiter_bytes()
                    reads = cast("AsyncGenerator[bytes, None]", data_in)
                    async with contextlib.aclosing(reads) as chunks:
                        async for raw in chunks:
                            if on_read(raw, time.perf_counter()):  # one time for the read
                                return
            if reply.finished_by_server:
                live.put_threadsafe(reply.finish(time.perf_counter()))
                return
            raise ConnectionLost(
                reply.tokens, self.url, "the stream ended before the reply finished"
            )
        except asyncio.CancelledError:
            if not live.done:
                live.put_threadsafe(reply.finish(time.perf_counter(), "abort"))
            raise
        except TimeoutError:
            waiting: Wait = "between chunks" if reader.reads else "first byte"
            live.put_threadsafe(
                ServerStalled(self.url, waiting, limits.limit(waiting), reply.tokens)
            )
        except StreamError as exc:
            live.put_threadsafe(
                RequestRejected(rid, f"the server stopped the reply: {visible(exc.message)}")
            )
        except KvscopeError as exc:
            live.put_threadsafe(exc)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if answered:
                live.put_threadsafe(ConnectionLost(reply.tokens, self.url, describe(exc)))
            else:
                live.put_threadsafe(transport_failure(self.url, exc, limits))
        except httpx.TransportError as exc:
            live.put_threadsafe(ConnectionLost(reply.tokens, self.url, describe(exc)))
        except EventTooLarge as exc:
            live.put_threadsafe(ConnectionLost(reply.tokens, self.url, str(exc)))
        except (ValueError, TypeError, ArithmeticError, AttributeError, RecursionError) as exc:
            # a chunk that is not a chunk: not JSON, nested past the parser, not an object
            live.put_threadsafe(ConnectionLost(reply.tokens, self.url, f"garbled stream: {exc}"))
        except Exception as exc:  # never leave the consumer waiting
            log.exception("kvscope: remote request failed")
            live.put_threadsafe(RequestRejected(rid, f"unexpected client error: {exc}"))
        finally:
            if reply.replaced and not self._said_not_unicode:
                self._said_not_unicode = True  # only the IO loop runs _run: no lock
                s = "" if reply.replaced == 1 else "s"
                log.warning(
                    "kvscope: the server at %s sent text that is not Unicode: %d lone "
                    "surrogate%s (half a UTF-16 pair, escaped in its JSON) in the reply to %s, "
                    "kept as U+FFFD; later ones are replaced without a word.",
                    self.url,
                    reply.replaced,
                    s,
                    rid,
                )

    async def _refusal(
        self, req: GenerationRequest, response: httpx.Response | LeanAnswer
    ) -> KvscopeError:
        """The typed error for a non-200 answer to a request."""
        body = await response.aread()
        if response.status_code in (401, 403):
            key_sent = bool(self.api_key or self._where.authorization)
            return AuthRequired(self.url, response.status_code, key_sent=key_sent)
        message = error_message(body)
        too_long = parse_too_long(message) if response.status_code == 400 else None
        card = self._card
        if too_long is not None:
            count = too_long.prompt_tokens
            if count is None:
                count = await self._exact_prompt_tokens(req)
            if too_long.max_model_len is not None:
                limit = too_long.max_model_len
            elif count is not None:
                # "max_tokens must be at least 1, got 0": the prompt fills the context.
                limit = count
            else:
                limit = card.max_model_len if card else 0
            if count is None:
                count = too_long.lower_bound or limit
            return PromptTooLong(count, limit)
        words = answer_words(response.status_code, message[:300], response.headers.get("location"))
        return RequestRejected(req.request_id, words)

    async def _exact_prompt_tokens(self, req: GenerationRequest) -> int | None:
        """The server stops counting a long chat at max_model_len + 1: ask /tokenize."""
        if req.prompt_token_ids is not None:
            return len(req.prompt_token_ids)
        http = self._http
        if http is None:
            return None
        try:
            r = await http.post(
                "/tokenize",
                json={
                    "model": self.model,
                    "messages": [{"role": m.role, "content": m.content} for m in req.messages],
                    "add_generation_prompt": True,
                },
            )
            count = r.json().get("count") if r.status_code == 200 else None
            return int(count) if isinstance(count, int) else None
        except (httpx.HTTPError, ValueError):
            return None

    async def answer(
        self, request: GenerationRequest, extra_body: Mapping[str, Any] | None = None
    ) -> WholeAnswer:
        """`request` not streamed: the server's whole answer at once (a disaggregated
        prefill's, engine/fleet/disaggregated.py, whose answer says where its KV is).

        Awaited on any loop; the POST runs on this engine's IO loop, as streams do, so its
        times do not depend on the caller's loop. Bounded by the first-byte timeout (the
        answer's first byte comes once the server is done). Raises KvscopeError in words.
        """
        loop = self._loop
        if loop is None or self._card is None:
            raise EngineDied("the remote engine is not attached; call start() first")
        path, body = self._body(request, self.session_id, extra_body)
        body["stream"] = False
        body.pop("stream_options", None)
        future = asyncio.run_coroutine_threadsafe(self._post_whole(request, path, body), loop)
        return await asyncio.wrap_future(future)

    async def _post_whole(
        self, request: GenerationRequest, path: str, body: dict[str, Any]
    ) -> WholeAnswer:
        http = self._http
        assert http is not None
        limits = self.timeouts
        sent = time.perf_counter()
        try:
            async with Watchdog(limits.first_byte_s):
                response = await http.post(path, json=body)
                if response.status_code != 200:
                    raise await self._refusal(request, response)
                data = response.json()
        except TimeoutError:
            raise ServerStalled(self.url, "first byte", limits.first_byte_s, 0) from None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise transport_failure(self.url, exc, limits) from None
        except httpx.TransportError as exc:
            raise ConnectionLost(0, self.url, describe(exc)) from None
        except ValueError as exc:
            raise ConnectionLost(0, self.url, f"an answer that is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConnectionLost(0, self.url, f"an answer of type {type(data).__name__}")
        return WholeAnswer(data, sent, time.perf_counter())

    async def fetch_text(self, path: str) -> str | None:
        """GET `path` (e.g. /metrics) on the IO loop; None if it does not answer 200."""
        loop, http = self._loop, self._http
        if loop is None or http is None:
            return None

        async def get() -> str | None:
            try:
                async with Watchdog(self.timeouts.first_byte_s):
                    response = await http.get(path)
            except (httpx.HTTPError, TimeoutError):
                return None
            return response.text if response.status_code == 200 else None

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(get(), loop))

    def abort(self, request_id: str) -> None:
        """Close that request's stream; vLLM aborts a request whose client went away."""
        live = self._book.streaming(request_id)
        if live is not None and live.future is not None and not live.done:
            live.future.cancel()

    # -- prompts -------------------------------------------------------------------------------
    def _require_prompts(self) -> RemotePrompts:
        if self._prompts is None:
            raise EngineDied("the remote engine is not attached; call start() first")
        return self._prompts

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """The server's own chat template and tokenizer, through POST /tokenize (or the
        tokenizer on this side, for a server that has no vLLM /tokenize)."""
        return self._wrap(lambda: self._require_prompts().chat_ids(messages))

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        return self._wrap(lambda: self._require_prompts().synthetic(num_tokens, suffix, seed))

    def _wrap(self, call: Callable[[], tuple[int, ...]]) -> tuple[int, ...]:
        try:
            return call()
        except ServerAnswer as exc:
            raise EngineStartFailed(f"{self.url}/tokenize answered {exc.words}") from exc

    # -- sessions (one per chat; KV events name the session that stored each block) ---------
    @staticmethod
    def _new_session_name() -> str:
        return f"kvscope-{uuid.uuid4().hex[:8]}"

    def new_session(self, session_id: str | None = None) -> str:
        """Start a new chat: later requests carry this session ID (a fresh one if None)."""
        self.session_id = session_id or self._new_session_name()
        return self.session_id

    def session_of(self, request_id: str) -> str | None:
        """The session ID a request was sent with."""
        return self._sessions.get(request_id)

    # -- the server, watched beside the requests (server_watch.py) ----------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """StepSamples made from scrapes (see REMOTE_LIMITS): one per scrape."""
        return self._watch.add_step_listener(listener)

    def add_scrape_listener(self, listener: ScrapeListener) -> Callable[[], None]:
        """The full ScrapeSample of every scrape, from the scraper's thread."""
        return self._watch.add_scrape_listener(listener)

    @property
    def last_scrape(self) -> ScrapeSample | None:
        return self._watch.last_scrape

    def prefix_cache(self) -> PrefixCacheView:
        """The cached blocks the server reported, by hash and session; never block IDs."""
        return self._watch.prefix_cache()

    @property
    def bad_samples(self) -> tuple[int, str]:
        """/metrics samples dropped since attach, and why the first one was."""
        return self._watch.bad_samples

    @property
    def capabilities(self) -> RemoteCapabilities:
        return self._watch.capabilities

    def _pool_changed(self, cache: CacheInfo) -> None:
        """A scrape told a different KV pool: the card says it from now on."""
        if self._card is not None:
            self._card = dataclasses.replace(
                self._card,
                block_size=cache.block_size,
                total_blocks=cache.total_blocks,
                unknown=tuple(
                    f for f in self._card.unknown if f not in ("block_size", "total_blocks")
                ),
            )

    def _reattach(self) -> None:
        """The server answers again after being gone: refresh the card and the model."""
        self.attachments += 1
        client = self._client(self.timeouts.scrape())
        try:
            model, served_len, _root = self._pick_model(client)
            max_len, _source = self._context(served_len)
            if self._card is not None and (visible(model), max_len) != (
                self._card.name,
                self._card.max_model_len,
            ):
                self._card = dataclasses.replace(
                    self._card, name=visible(model), max_model_len=max_len
                )
                self.model = model
        except (KvscopeError, ServerAnswer) as exc:
            log.info("kvscope: re-attach to %s: %s", self.url, exc)
        finally:
            client.close()


if TYPE_CHECKING:  # mypy checks that RemoteEngine keeps to the Engine protocol
    from engine.protocol import Engine

    _conforms: Engine = RemoteEngine("http://127.0.0.1:8000")
