"""Token IDs on this side, for a server that cannot count them (no vLLM `/tokenize`).

As `vllm bench serve --tokenizer` does: transformers' AutoTokenizer, by default the served
model's own name or path. When that is not on this machine (a mock's made-up name, a hub
name with no network), kvscope's embedded model's tokenizer stands in, and says so: the
prompt lengths are then exact for that tokenizer, which is what the server is sent.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from engine.errors import BadOption, EngineStartFailed

if TYPE_CHECKING:
    from collections.abc import Sequence


def _load(name: str, *, local_only: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, local_files_only=local_only)


class ClientTokenizer:
    """A Hugging Face tokenizer behind RemotePrompts' two calls, and the text it sends."""

    local = True

    def __init__(self, tokenizer: Any, name: str, note: str = "") -> None:
        self._tok = tokenizer
        self.name = name
        self.note = note  # why this is not the served model's own tokenizer; "" if it is
        self._lock = threading.Lock()  # HF fast tokenizers are not safe across threads

    @classmethod
    def load(cls, given: str | None, served: Sequence[str]) -> ClientTokenizer:
        """`--tokenizer` as given (fetched if it must be), else the first of `served`
        (the model's root, then its name) found on this machine, else kvscope's own."""
        if given:
            try:
                return cls(_load(given, local_only=False), given)
            except Exception as exc:  # transformers raises OSError, ValueError and more
                raise BadOption(
                    "--tokenizer",
                    f"{given!r} is not a tokenizer folder or a Hugging Face name this "
                    f"machine can load ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
                ) from None
        for name in dict.fromkeys(served):
            try:
                return cls(_load(name, local_only=True), name)
            except Exception:  # not a folder here, not in the Hugging Face cache
                continue
        from engine import model_prep

        own = model_prep.embedded_model_dir()
        try:
            tok = _load(str(own), local_only=True)
        except Exception as exc:
            raise EngineStartFailed(
                f"the server names its model {', '.join(map(repr, served))}, which has no "
                f"tokenizer on this machine, and kvscope's own model is not prepared yet "
                f"({own}): give --tokenizer NAME_OR_FOLDER, or run `kvscope prepare-model`"
            ) from exc
        names = " or ".join(repr(s) for s in dict.fromkeys(served))
        note = (
            f"No tokenizer for {names} on this machine: prompt tokens are counted with "
            f"kvscope's own ({model_prep.EMBEDDED_MODEL_NAME}); give --tokenizer to count "
            "as the server does."
        )
        return cls(tok, model_prep.EMBEDDED_MODEL_NAME, note)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat as the model reads it, with the assistant's turn opened."""
        with self._lock:
            if getattr(self._tok, "chat_template", None):
                ids = self._tok.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True
                )
                # transformers 5 answers a BatchEncoding; 4 a plain list.
                ids = ids["input_ids"] if not isinstance(ids, list) else ids
                return [int(t) for t in ids]
            # A base model's tokenizer has no template: the words, one turn after another.
            text = "\n".join(m["content"] for m in messages)
            return [int(t) for t in self._tok.encode(text, add_special_tokens=True)]

    def text_ids(self, text: str) -> list[int]:
        with self._lock:
            return [int(t) for t in self._tok.encode(text, add_special_tokens=False)]

    def text(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens written out (a template's markers), so that
        the server's tokenizer, if it is this one, reads the same tokens back."""
        with self._lock:
            return str(self._tok.decode(list(ids), skip_special_tokens=False))
