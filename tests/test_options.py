"""kvscope's engine options: the no-flags fast path agrees with vLLM's own parser."""

from __future__ import annotations

import dataclasses

from engine.vllm.options import build_engine_settings


def test_no_flags_gives_the_same_engine_args_as_the_parser() -> None:
    fast = build_engine_settings([]).engine_args
    # Any flag at its default value takes the parser path.
    parsed = build_engine_settings(["--seed", str(fast.seed)]).engine_args
    differ = {
        f.name: (getattr(fast, f.name), getattr(parsed, f.name))
        for f in dataclasses.fields(fast)
        if getattr(fast, f.name) != getattr(parsed, f.name)
    }
    assert not differ
