"""Exact prompts through a tokenizer: the server's own (vLLM's `POST /tokenize`), or one on
this side (client_tokenizer.py) for a server that has none.

A synthetic prompt is the chat template's head and tail (found by tokenizing two chats
that differ only in the user's words), random filler token IDs between them, then the
suffix. IDs are joined, never re-tokenized, and sent to /v1/completions as a token list,
so the server sees exactly as many prompt tokens as asked for (a server that takes no
token IDs is sent their text, which the same tokenizer reads back as the same IDs).
"""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Protocol

from engine.errors import KvscopeError, RequestRejected

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.events import ChatMessage
    from engine.remote.client import ServerClient

FILLER_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu "
    "river mountain garden window silver market forest castle winter summer harbor island "
    "engine signal number letter bridge candle meadow rocket planet library kitchen pocket "
    "yellow purple orange copper marble velvet thunder shadow morning evening journey "
    "question answer pattern measure balance circle square triangle valley canyon desert "
    "ocean breeze pepper ginger butter cotton leather paper pencil basket ladder button "
    "camera guitar violin trumpet dragon falcon tiger rabbit turtle salmon spider monkey"
)


# The longest prompt kvscope builds: the longest context any served model has (Llama 4
# Scout's 10M). A server that claims more (max_model_len 10^11) makes no prompt of that size.
MAX_SYNTHETIC_TOKENS = 10_000_000


class PromptTooBigToBuild(KvscopeError):
    """A synthetic prompt past MAX_SYNTHETIC_TOKENS, refused before anything is built."""

    def __init__(self, num_tokens: int, limit: int = MAX_SYNTHETIC_TOKENS) -> None:
        super().__init__(num_tokens, limit)
        self.num_tokens = num_tokens
        self.limit = limit

    def plain(self) -> str:
        return (
            f"A prompt of {self.num_tokens:,} tokens is past the {self.limit:,} kvscope builds "
            "(the longest context any model has), whatever context the server claims; "
            "ask for a shorter one."
        )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PromptTokenizer(Protocol):
    """The two questions a synthetic prompt asks: a chat's IDs (with the assistant's turn
    opened) and a text's IDs (no special tokens). `local` tokenizers answer in microseconds,
    so filler is checked word by word there (see RemotePrompts.filler)."""

    local: bool

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]: ...

    def text_ids(self, text: str) -> list[int]: ...


class ServerTokenizer:
    """vLLM's `POST /tokenize`: the served model's own tokenizer and chat template."""

    local = False

    def __init__(self, client: ServerClient, model: str) -> None:
        self.client = client
        self.model = model

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.client.tokenize_messages(self.model, messages)

    def text_ids(self, text: str) -> list[int]:
        return self.client.tokenize_text(self.model, text)


class RemotePrompts:
    """Token IDs from the tokenizer and chat template; cached once learned."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._frame: tuple[list[int], list[int]] | None = None
        self._filler: list[int] | None = None

    def chat_ids(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        with self._lock:
            ids = self.tokenizer.chat_ids(chat)
        return tuple(ids)

    def frame(self) -> tuple[list[int], list[int]]:
        """The template's tokens before and after a user message's content."""
        if self._frame is None:
            with self._lock:
                one = self.tokenizer.chat_ids([{"role": "user", "content": "x"}])
                two = self.tokenizer.chat_ids([{"role": "user", "content": "hello there"}])
            head = _common_prefix(one, two)
            tail = _common_prefix(one[::-1], two[::-1])
            tail = min(tail, len(one) - head, len(two) - head)
            self._frame = (two[:head], two[len(two) - tail :] if tail else [])
        return self._frame

    def filler(self) -> list[int]:
        if self._filler is None:
            with self._lock:
                if self.tokenizer.local:
                    # Only words that are one token each: any run of them, sent as text,
                    # is read back as the same IDs (a split word's halves might merge).
                    words = [self.tokenizer.text_ids(" " + w) for w in FILLER_WORDS.split()]
                    ids = [w[0] for w in words if len(w) == 1]
                else:
                    ids = self.tokenizer.text_ids(" " + FILLER_WORDS)
            self._filler = list(dict.fromkeys(ids))  # distinct, in order
        return self._filler

    def synthetic(self, num_tokens: int, suffix: str = "", seed: int = 0) -> tuple[int, ...]:
        """Exactly `num_tokens` IDs: template head, seeded random filler, suffix, tail."""
        if num_tokens <= 0:
            raise ValueError("num_tokens must be positive")
        if num_tokens > MAX_SYNTHETIC_TOKENS:
            raise PromptTooBigToBuild(num_tokens)
        head, tail = self.frame()
        filler = self.filler()
        if not filler:
            raise RequestRejected("tokenize", "the server's tokenizer gave no filler tokens")
        if suffix:
            with self._lock:
                user = self.tokenizer.text_ids(" " + suffix)
        else:
            user = []
        rng = random.Random(seed)
        room = num_tokens - len(head) - len(user) - len(tail)
        if room < 0:
            # Too short for the template: filler only, still exactly num_tokens.
            ids = [rng.choice(filler) for _ in range(num_tokens)]
        else:
            ids = head + [rng.choice(filler) for _ in range(room)] + user + tail
        if len(ids) != num_tokens:  # cannot happen; the count is the whole point
            raise AssertionError(f"synthetic prompt has {len(ids)} tokens, not {num_tokens}")
        return tuple(ids)
