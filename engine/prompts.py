"""Prompt building: the chat template, and synthetic prompts of exactly N tokens.

Engines call these with their own tokenizer; IDs are joined, never re-tokenized, so a
synthetic prompt's length is exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.events import ChatMessage

_SENTINEL = "\x00kvscope-sentinel\x00"


def chat_prompt_ids(tokenizer: Any, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
    """The exact token IDs the model's chat template makes of `messages`."""
    out = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True,
        tokenize=True,
    )
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return tuple(int(i) for i in out)


def filler_vocabulary(tokenizer: Any) -> list[int]:
    """Token IDs that decode to one plain lowercase word with a leading space.

    Decoding 50,000 IDs one at a time takes about 0.3 s, so the list is kept in the cache
    folder, keyed by the tokenizer's vocabulary, and read back on later runs.
    """
    path = _filler_cache_path(tokenizer)
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            cached = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(cached, list) and all(isinstance(i, int) for i in cached):
                return cached
    ids = _scan_filler(tokenizer)
    if path is not None:
        # A read-only cache folder only costs the next run the same 0.3 s.
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(ids), encoding="utf-8")
            os.replace(tmp, path)
    return ids


def _filler_cache_path(tokenizer: Any) -> Path | None:
    try:
        from engine.paths import cache_dir

        # Cheap to compute: the tokenizer's name, size, and its file's size and mtime.
        name = str(getattr(tokenizer, "name_or_path", ""))
        key = [name, len(tokenizer)]
        tok_file = Path(name) / "tokenizer.json"
        if tok_file.is_file():
            st = tok_file.stat()
            key += [st.st_size, st.st_mtime_ns]
        digest = hashlib.sha1(json.dumps(key).encode(), usedforsecurity=False).hexdigest()[:16]
        return cache_dir() / "filler" / f"{digest}.json"
    except Exception:
        return None


def _scan_filler(tokenizer: Any) -> list[int]:
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
