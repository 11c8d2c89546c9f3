"""vLLM's parallel flags pass through unchanged, and the model card names the layout.

These machines have no GPU: what runs here is the parsing and the card; a multi-GPU start
itself is not tested (see docs/gpu.md, "On many GPUs").
"""

from __future__ import annotations

from types import SimpleNamespace

from engine.vllm.engine import _parallel_layout
from engine.vllm.options import build_engine_settings


def test_parallel_flags_reach_vllms_engine_args() -> None:
    settings = build_engine_settings(
        [
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ]
    )
    args = settings.engine_args
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 2)
    assert args.data_parallel_size == 1  # more is refused in-process (tests/test_gpu_true.py)
    assert args.distributed_executor_backend == "ray"


def test_the_card_names_the_layout_only_when_there_is_one() -> None:
    one = SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1)
    assert _parallel_layout(one) == ""
    many = SimpleNamespace(
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        data_parallel_size=1,
        distributed_executor_backend="mp",
    )
    assert _parallel_layout(many) == "TP 4 x PP 2 x DP 1 (mp)"
