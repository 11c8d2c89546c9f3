"""Round robin over the replicas, when no router is given (`--replica` without `--url`).

One engine/remote RemoteEngine per replica; each request goes to the next replica in
turn, skipping any the fleet's scrapes say is down, so the others carry on. kvscope chose
the replica, so it knows which one served each request (attribution's "round robin").
The first replica stands for the fleet where one server is needed: its card, its
scrapes in the Server panel's charts, its tokenizer for chat prompts.

Every replica must serve the same model: a round robin over two models is two chats.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from engine.errors import EngineStartFailed
from engine.events import LoadProgress
from engine.fleet.attribution import Attribution, from_round_robin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from engine.events import (
        ChatMessage,
        EngineEvent,
        GenerationRequest,
        ModelCard,
        ProgressCallback,
        StepListener,
    )
    from engine.features import EngineFeatures
    from engine.remote import RemoteEngine

# Request IDs remembered with their replica: enough for any reply still on screen.
MAX_REMEMBERED = 4096


class RoundRobinEngine:
    """Each request to the next replica in turn; `engines` are (name, RemoteEngine)."""

    def __init__(self, engines: Sequence[tuple[str, RemoteEngine]]) -> None:
        if not engines:
            raise ValueError("a round robin needs at least one replica")
        self.engines = tuple(engines)
        self.names = tuple(name for name, _ in self.engines)
        self.primary = self.engines[0][1]
        self.session_id = self.primary.session_id
        self.healthy: Callable[[str], bool] = lambda _name: True
        """Whether a replica should get requests; FleetEngine answers from the scrapes."""
        self._next = 0
        self._sent: OrderedDict[str, str] = OrderedDict()  # request ID -> replica
        self._lock = threading.Lock()

    @property
    def card(self) -> ModelCard | None:
        return self.primary.card

    @property
    def features(self) -> EngineFeatures:
        return self.primary.features

    def start(self, progress: ProgressCallback | None = None) -> ModelCard:
        """Attach to every replica in order; each must serve the first one's model."""
        report = progress or (lambda _p: None)
        n = len(self.engines)
        cards = []
        for i, (name, engine) in enumerate(self.engines):

            def scaled(p: LoadProgress, i: int = i, name: str = name) -> None:
                report(LoadProgress(f"replica {name}: {p.stage}", (i + p.fraction) / n))

            cards.append(engine.start(scaled))
        first = self.engines[0]
        for (name, engine), card in zip(self.engines, cards, strict=True):
            if engine.model != first[1].model:
                raise EngineStartFailed(
                    f"replica {name} serves {card.name!r}, replica {first[0]} serves "
                    f"{cards[0].name!r}: a round robin needs one model on every replica"
                )
        return cards[0]

    def pick(self) -> str:
        """The next replica in turn that is healthy (the next in turn if none is)."""
        with self._lock:
            n = len(self.engines)
            for k in range(n):
                i = (self._next + k) % n
                if self.healthy(self.names[i]):
                    self._next = i + 1
                    return self.names[i]
            i = self._next % n
            self._next = i + 1
            return self.names[i]

    def _engine(self, name: str) -> RemoteEngine:
        return next(e for n, e in self.engines if n == name)

    def routing_words(self) -> str:
        """How requests reach the replicas, in words for the fleet view."""
        names = ", ".join(self.names)
        return (
            f"routing: kvscope's round robin over {names} (no --url router), skipping "
            f"a replica that is down; the charts are replica {self.names[0]}'s"
        )

    def attribution(self, request_id: str) -> Attribution:
        """Which replica served a request: the one it was sent to."""
        return from_round_robin(self.served_by(request_id))

    def remember(self, request_id: str, name: str) -> None:
        """That `request_id` went to replica `name` (for served_by and abort)."""
        with self._lock:
            self._sent[request_id] = name
            while len(self._sent) > MAX_REMEMBERED:
                self._sent.popitem(last=False)

    def stream(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        name = self.pick()
        engine = self._engine(name)
        self.remember(request.request_id, name)
        # One chat is one session on every replica: its blocks are coloured alike.
        engine.session_id = self.session_id
        return engine.stream(request)

    def served_by(self, request_id: str) -> str | None:
        with self._lock:
            return self._sent.get(request_id)

    def abort(self, request_id: str) -> None:
        name = self.served_by(request_id)
        if name is not None:
            self._engine(name).abort(request_id)

    def new_session(self, session_id: str | None = None) -> str:
        self.session_id = self.primary.new_session(session_id)
        return self.session_id

    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        return self.primary.add_step_listener(listener)

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        return self.primary.chat_prompt_ids(messages)

    def synthetic_prompt(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        return self.primary.synthetic_prompt(num_tokens, suffix, seed)

    def shutdown(self) -> None:
        for _, engine in self.engines:
            engine.shutdown()


if TYPE_CHECKING:  # mypy checks that it keeps to the Engine protocol
    from engine.protocol import Engine
    from engine.remote import RemoteEngine as _Remote

    _conforms: Engine = RoundRobinEngine([("a", _Remote("http://127.0.0.1:8000"))])
