"""What attaching does with words it cannot use: a vLLM flag belongs to the server, and a
bare word is most likely a message typed without --prompt."""

from __future__ import annotations

import argparse

import pytest

from cli.attach import make_remote
from engine.errors import BadOption


def _args() -> argparse.Namespace:
    return argparse.Namespace(
        url="http://127.0.0.1:9", kv_events="off", api_key=None, served_model_name=None
    )


def test_a_vllm_flag_is_sent_to_the_server() -> None:
    with pytest.raises(BadOption) as refused:
        make_remote(_args(), ["--block-size", "16"])
    assert "belong to the server" in refused.value.plain()
    assert "--block-size 16" in refused.value.plain()


def test_a_bare_word_is_taken_for_a_message() -> None:
    with pytest.raises(BadOption) as refused:
        make_remote(_args(), ["hello"])
    assert refused.value.plain() == (
        "Bad value for hello: not an option of kvscope; a message goes in --prompt '...'"
    )
