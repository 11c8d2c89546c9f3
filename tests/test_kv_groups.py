"""Every KV cache group: the reader of vLLM's block lists, on lists changed in place and on
the real engine's pool.

A hybrid model's sliding-window group swaps the blocks that left its window for the null
block (vLLM's block 0) in place, from the head of a request's list; the reader must drop
them at once, not at its next full re-read. The unit tests build vLLM's structures from
plain objects; the engine test checks, step by step, that the blocks the samples say are
held are exactly the blocks the pool does not have free.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from engine_hooks import SCHEDULING_MODES, scheduling
from subprocess_report import run_and_report

from engine.events import GenerationRequest, KvCacheGroup, ModelCard, SamplingSettings
from engine.vllm.internals import EngineIntrospector, GroupReader, drawn_group
from tui.widgets.kv_block_map import drawn_group_note

if TYPE_CHECKING:
    from pathlib import Path

    from engine.events import StepSample
    from engine.vllm.engine import VllmEngine


@dataclass(eq=False)
class Block:
    block_id: int


NULL = Block(0)  # vLLM's null block: one object, put in a list wherever a block was freed


@dataclass
class Manager:
    req_to_blocks: dict[str, list[Block]] = field(default_factory=dict)


@dataclass
class Request:
    request_id: str
    num_computed_tokens: int


@dataclass
class Scheduler:
    running: list[Request]


def full_read(blocks: list[Block]) -> tuple[int, ...]:
    return tuple(b.block_id - 1 for b in blocks if b.block_id > 0)


def null_head(blocks: list[Block], upto: int) -> None:
    """What vLLM's `_remove_blocks_in_range(rid, 0, upto)` does to a list: from the back,
    until a block already null."""
    for i in range(min(upto, len(blocks)) - 1, -1, -1):
        if blocks[i] is NULL:
            break
        blocks[i] = NULL


def test_a_sliding_window_list_nulled_in_place_is_read_at_once() -> None:
    table: dict[str, list[Block]] = {"r": [Block(1 + i) for i in range(6)]}
    reader = GroupReader(Manager(table), 16, kind="sliding window 64", in_place="head")
    assert reader.ids("r") == (0, 1, 2, 3, 4, 5)
    table["r"].append(Block(7))
    assert reader.ids("r") == (0, 1, 2, 3, 4, 5, 6)  # an append reuses the last read
    null_head(table["r"], 2)  # same list object, same length: only its head changed
    assert reader.ids("r") == (2, 3, 4, 5, 6)
    null_head(table["r"], 4)
    table["r"].append(Block(8))
    assert reader.ids("r") == (4, 5, 6, 7)


def test_a_window_sliding_over_many_requests_reads_as_a_full_read_every_step() -> None:
    rng = random.Random(19)
    table: dict[str, list[Block]] = {}
    reader = GroupReader(Manager(table), 4, kind="sliding window 16", in_place="head")
    next_id = 1
    for step in range(300):
        if step % 7 == 0 and len(table) < 12:
            rid = f"r{step}"
            # A prefix-cache hit that starts past the window begins with null padding.
            table[rid] = [NULL] * rng.randrange(3) + [Block(next_id)]
            next_id += 1
        for blocks in table.values():
            if rng.random() < 0.5:
                blocks.append(Block(next_id))
                next_id += 1
            if rng.random() < 0.3:
                null_head(blocks, len(blocks) - 4)  # keep a window of four blocks
        for rid, blocks in table.items():
            assert reader.ids(rid) == full_read(blocks), f"step {step} {rid}"


def hybrid(
    tokens: int,
) -> tuple[EngineIntrospector, dict[str, list[Block]], dict[str, list[Block]]]:
    """A request in a two-group model as vLLM lays it out: group 0 sliding window (window of
    two 16-token blocks, the rest nulled), group 1 full attention (a block per 16 tokens)."""
    n = -(-tokens // 16)
    window = {"r": [NULL] * (n - 2) + [Block(100 + i) for i in range(n - 2, n)]}
    full = {"r": [Block(1 + i) for i in range(n)]}
    groups = (
        GroupReader(Manager(window), 16, kind="sliding window 32", num_layers=3, in_place="head"),
        GroupReader(Manager(full), 16, kind="full attention", num_layers=1),
    )
    intro = EngineIntrospector.__new__(EngineIntrospector)
    intro.scheduler = Scheduler([Request("r", tokens)])
    intro._begin(None, groups)
    return intro, window, full


def test_the_full_attention_group_is_drawn_and_every_group_counts_blocks_in_flight() -> None:
    intro, window, full = hybrid(tokens=160)
    assert intro.drawn == 1
    (held,) = intro.live_blocks({"r": "chat-1"})
    assert held.request_id == "chat-1"
    assert held.block_ids == tuple(range(10)), "the full-attention group's blocks, all ten"
    assert intro.block_size == 16
    # A batch still in flight took 32 more tokens: two new blocks in each group (the
    # window's list is nulled at the head as it goes), none of them the step's shown.
    intro.scheduler.running[0].num_computed_tokens = 192
    full["r"] += [Block(11), Block(12)]
    window["r"][8:10] = [NULL, NULL]
    window["r"] += [Block(110), Block(111)]
    work = type("Work", (), {"per_request": {"r": (0, 32)}})()
    intro._in_flight = {1: (object(), work)}
    (held,) = intro.live_blocks({})
    assert held.block_ids == tuple(range(10)) and held.num_tokens == 160
    assert intro.blocks_ahead == 4
    assert drawn_group(()) == 0 and drawn_group(intro.groups[:1]) == 0


def test_the_card_counts_a_hybrid_pool_as_vllm_does_and_one_group_as_before() -> None:
    groups = (KvCacheGroup("sliding window 32", 16, 3), KvCacheGroup("full attention", 16, 1, True))
    one = ModelCard("m", "m", "bfloat16", 4, 1, 64, 512, 4096, 16, 1000, "cpu")
    assert one.kv_pool_tokens == 16_000
    two = ModelCard(
        "m", "m", "bfloat16", 4, 1, 64, 512, 4096, 16, 1000, "cpu", kv_groups=groups,
        kv_capacity_tokens=9_000,
    )  # fmt: skip
    assert two.kv_pool_tokens == 9_000
    assert drawn_group_note(groups) == "blocks of group 2/2: full attention, 1 layers"
    assert drawn_group_note(groups[1:]) == ""


# -- the real engine --------------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.parametrize("mode", SCHEDULING_MODES)
async def test_held_blocks_are_the_pools_used_blocks_at_every_step(
    vllm_engine: VllmEngine, mode: str
) -> None:
    """The union of the blocks the samples say are held equals total - free, every step.
    The session engine runs with prefix caching on (vLLM's default); these prompts share no
    block, which the test checks too (no block in two requests)."""
    engine = vllm_engine
    intro = engine.introspection
    assert [g.kind for g in intro.kv_groups] == ["full attention"]
    assert intro.kv_groups[0].drawn and intro.kv_capacity_tokens == 0
    assert intro.block_size == int(intro.vllm_config.cache_config.block_size)
    card = engine.card
    assert card is not None and card.kv_pool_tokens == card.total_blocks * card.block_size
    bad: list[str] = []
    steps = [0]

    def check(sample: StepSample) -> None:
        held = [b for rb in sample.blocks for b in rb.block_ids]
        used = sample.total_blocks - sample.free_blocks
        steps[0] += 1
        if len(set(held)) != len(held) or len(held) != used:
            bad.append(f"step {sample.step}: {len(set(held))} held ({len(held)}), {used} used")

    async def one(i: int) -> None:
        ids = engine.synthetic_prompt(150 + 170 * i, seed=1900 + i)
        request = GenerationRequest(
            f"groups-{mode}-{i}",
            prompt_token_ids=ids,
            sampling=SamplingSettings(30, ignore_eos=True),
        )
        async for _ in engine.stream(request):
            pass

    with scheduling(engine, mode):
        remove = engine.add_step_listener(check)
        try:
            await asyncio.gather(*(one(i) for i in range(3)))
        finally:
            remove()
    assert steps[0] >= 25  # 30 decode steps, whatever the prompts share of a step
    assert not bad, bad[:3]


# A two-layer Llama with random weights, its first layer a 32-token sliding window: vLLM
# makes two KV cache groups, group 0 the sliding window (the one kvscope used to read).
HYBRID_SCRIPT = r"""
import asyncio, json, shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from engine.model_prep import prepare_embedded_model

folder = Path(sys.argv[1])
tokenizer = prepare_embedded_model()
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (tokenizer / name).exists():
        shutil.copy(tokenizer / name, folder / name)
config = LlamaConfig(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)
config.layer_types = ["sliding_attention", "full_attention"]
config.sliding_window = 32
torch.manual_seed(19)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)

from engine.events import GenerationRequest, SamplingSettings
from engine.vllm.engine import VllmEngine

engine = VllmEngine(argv=[
    "--model", str(folder), "--max-model-len", "1024",
    "--kv-cache-memory-bytes", str(8 * 1024**2), "--no-enable-prefix-caching",
])
card = engine.start()
intro = engine.introspection
bad, nulls, steps = [], [0], [0]

def check(sample):
    steps[0] += 1
    held = set()
    for rb in sample.blocks:
        live = engine._book.get(rb.request_id)
        groups = intro.kv_manager.get_block_ids(live.internal_id)  # vLLM's own copies
        for i, ids in enumerate(groups):
            held |= {b - 1 for b in ids if b > 0}
            nulls[0] += ids.count(0)
            own = tuple(b - 1 for b in ids if b > 0)
            read = intro.groups[i].ids(live.internal_id)
            if read != own:
                bad.append(f"step {sample.step} group {i}: read {read} != {own}")
        if rb.block_ids != tuple(b - 1 for b in groups[intro.drawn] if b > 0):
            bad.append(f"step {sample.step}: the sample's blocks are not the drawn group's")
    used = sample.total_blocks - sample.free_blocks
    if len(held) != used:
        bad.append(f"step {sample.step}: {len(held)} held, {used} used")

engine.add_step_listener(check)

async def one(i):
    ids = engine.synthetic_prompt(100 + 60 * i, seed=1900 + i)
    request = GenerationRequest(
        f"h{i}", prompt_token_ids=ids, sampling=SamplingSettings(120, ignore_eos=True)
    )
    async for _ in engine.stream(request):
        pass

async def main():
    await asyncio.gather(*(one(i) for i in range(3)))

asyncio.run(main())
report = dict(
    groups=[[g.kind, g.block_size, g.num_layers, g.drawn] for g in card.kv_groups],
    pool_tokens=card.kv_pool_tokens, blocks_times_size=card.total_blocks * card.block_size,
    vllms=intro.vllm_config.cache_config.kv_cache_size_tokens, card_block_size=card.block_size,
    steps=steps[0], nulls=nulls[0], bad=bad[:5],
)
print("HYBRID" + json.dumps(report))
engine.shutdown()
"""


@pytest.mark.engine
def test_a_sliding_window_hybrid_runs_with_every_group_read_right(tmp_path: Path) -> None:
    """A tiny hybrid model made here from a config runs through the real engine (one
    subprocess, ~45 s): every group's incremental read equals vLLM's own every step, while
    the window nulls blocks in place; the samples carry the full-attention group's blocks;
    all groups together hold exactly the pool's used blocks; the card's capacity is vLLM's."""
    got = run_and_report(HYBRID_SCRIPT.replace("sys.argv[1]", repr(str(tmp_path))), "HYBRID")
    assert got["groups"][0][0] == "sliding window 32" and not got["groups"][0][3]
    assert got["groups"][1][0] == "full attention" and got["groups"][1][3]
    assert got["card_block_size"] == got["groups"][1][1]
    assert got["steps"] > 100 and got["nulls"] > 0, got
    assert not got["bad"], got["bad"]
    assert got["pool_tokens"] == got["vllms"] < got["blocks_times_size"]
