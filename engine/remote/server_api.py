"""Which OpenAI-compatible API a server speaks: vLLM's own, or only the common part.

Every peer (`vllm bench serve`, AIPerf, GuideLLM) measures any OpenAI-compatible server;
kvscope does too. vLLM's server adds what makes its panels exact: `/tokenize` with chat
messages (its own chat template), token-ID prompts, `max_model_len` in `/v1/models`,
`return_token_ids`, sessions and KV-cache reports. A server without them (GuideLLM's
mock, SGLang, llama.cpp, a gateway) gets the common body and a tokenizer on this side.

Probed once at attach, from one `/tokenize` call: the answer is the only thing a server
can be trusted to say about itself (a gateway in front of vLLM names itself nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ContextSource = Literal["server", "flag", "unknown"]


@dataclass(frozen=True, slots=True)
class ServerApi:
    """What the attached server takes beyond the OpenAI API, and where its limit came from."""

    vllm: bool
    """It answers vLLM's `/tokenize` with chat messages: it is vLLM's server, so prompts
    are token IDs counted by the server, and vLLM's extra body fields are sent."""
    context: ContextSource
    """Where `max_model_len` came from: its `/v1/models`, `--max-model-len`, or nowhere."""
    tokenizer: str = ""
    """The client-side tokenizer's name (a folder or a Hugging Face name); "" for vLLM."""
    tokenizer_note: str = ""
    """Why the tokenizer is not the served model's own, in one sentence; "" when it is."""

    @property
    def token_prompts(self) -> bool:
        """Prompts go as token IDs (exact, never re-tokenized); else as text."""
        return self.vllm

    def notes(self) -> tuple[str, ...]:
        """What this server does not tell, one sentence each, for panels and --json."""
        if self.vllm:
            return ()
        out = [
            "Not a vLLM server (no vLLM /tokenize): prompts are sent as text and counted "
            f"by kvscope's tokenizer ({self.tokenizer}), as `vllm bench serve` counts them."
        ]
        if self.tokenizer_note:
            out.append(self.tokenizer_note)
        if self.context == "unknown":
            out.append(
                "The server does not say its context limit (max_model_len): no wall is "
                "drawn for it; give --max-model-len N to draw one."
            )
        return tuple(out)


VLLM_API = ServerApi(vllm=True, context="server")
"""vLLM's own server, with its limit in /v1/models."""
