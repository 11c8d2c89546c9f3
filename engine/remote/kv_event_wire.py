"""A vLLM server's KV-cache events as they come over the wire: untyped msgpack, checked.

Wire format (vLLM 0.32, `vllm/distributed/kv_events.py`): each message is three frames,
(topic, 8-byte big-endian sequence number, msgpack payload). The payload is an
`EventBatch` packed as an array, `[timestamp, [event, ...], data_parallel_rank]`, and each
event is a map tagged by `"type"`: BlockStored, BlockRemoved or AllBlocksCleared. It is
decoded untyped with msgspec, so no vLLM is needed on the client.

No event carries a block ID, a request ID, or a free/in-use state: what the events can
rebuild is the prefix-cache index (engine/remote/prefix_cache_index.py), never the
physical block map.

Every field of every event is checked before it is used (`_event`): an event that fails
is dropped and counted, the rest of its batch kept. An event names at most
MAX_HASHES_PER_EVENT blocks, so a publisher cannot make one event cost unbounded memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

MAX_HASHES_PER_EVENT = 1 << 16
MAX_BLOCK_SIZE = 1 << 20
MAX_HASH_BYTES = 64

BlockHash = int | bytes


class BadEvent(ValueError):
    """An event whose fields are not what vLLM sends."""


@dataclass(frozen=True)
class KvEvent:
    kind: str  # "BlockStored", "BlockRemoved", "AllBlocksCleared", or a newer kind
    block_hashes: tuple[BlockHash, ...] = ()
    parent_hash: BlockHash | None = None
    num_tokens: int = 0
    block_size: int = 0
    session_id: str | None = None


@dataclass(frozen=True)
class KvBatch:
    ts: float
    events: tuple[KvEvent, ...]
    rank: int | None
    bad: int = 0  # events dropped for fields vLLM never sends


def _is_hash(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(1 << 63) <= value < (1 << 64)  # vLLM's are 64-bit, signed or not
    return isinstance(value, bytes) and 0 < len(value) <= MAX_HASH_BYTES


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise BadEvent("block_hashes is not a list")
    if len(value) > MAX_HASHES_PER_EVENT:
        raise BadEvent(f"{len(value):,} block hashes in one event")
    if not all(_is_hash(h) for h in value):
        raise BadEvent("a block hash that is not a 64-bit number or a short byte string")
    return tuple(value)


def _hash(value: Any) -> BlockHash | None:
    if value is None:
        return None
    if not _is_hash(value):
        raise BadEvent("parent_block_hash is not a block hash")
    return value  # type: ignore[no-any-return]


def _count(value: Any, what: str, limit: int) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise BadEvent(f"{what} is {str(value)[:20]}, not a whole number from 0 to {limit:,}")
    return value


def _num_tokens(tokens: Any, hashes: int) -> int:
    if tokens is None:
        return 0
    if not isinstance(tokens, list):
        raise BadEvent("token_ids is not a list")
    # Only the count is kept: the IDs themselves are not looked at.
    if len(tokens) > max(1, hashes) * MAX_BLOCK_SIZE:
        raise BadEvent(f"{len(tokens):,} token IDs for {hashes:,} blocks")
    return len(tokens)


def _session(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise BadEvent("session_id is not a short string")
    return value


def _event(raw: Any) -> KvEvent:
    """One event, every field checked; raises BadEvent."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if not isinstance(kind, str):
            raise BadEvent("an event with no type")
        hashes = _hashes(raw.get("block_hashes"))
        return KvEvent(
            kind=kind[:64],
            block_hashes=hashes,
            parent_hash=_hash(raw.get("parent_block_hash")),
            num_tokens=_num_tokens(raw.get("token_ids"), len(hashes)),
            block_size=_count(raw.get("block_size"), "block_size", MAX_BLOCK_SIZE),
            session_id=_session(raw.get("session_id")),
        )
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        # Array-like tagged events (other vLLM versions): [tag, block_hashes, ...].
        kind = raw[0][:64]
        if kind == "BlockStored" and len(raw) >= 5:
            hashes = _hashes(raw[1])
            return KvEvent(
                kind=kind,
                block_hashes=hashes,
                parent_hash=_hash(raw[2]),
                num_tokens=_num_tokens(raw[3], len(hashes)),
                block_size=_count(raw[4], "block_size", MAX_BLOCK_SIZE),
            )
        if kind == "BlockRemoved" and len(raw) >= 2:
            return KvEvent(kind=kind, block_hashes=_hashes(raw[1]))
        return KvEvent(kind=kind)
    raise BadEvent("an event that is neither a map nor a tagged array")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def decode_batch(payload: bytes) -> KvBatch:
    """One message's payload; raises ValueError if it is not an event batch. Events that
    fail their checks are left out, and counted in the batch's `bad`."""
    try:
        obj = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from exc
    if isinstance(obj, dict):
        ts, events, rank = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    elif isinstance(obj, list) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise ValueError("not an event batch")
    if not isinstance(events, list):
        raise ValueError("event batch without an event list")
    good: list[KvEvent] = []
    bad = 0
    for raw in events:
        try:
            good.append(_event(raw))
        except BadEvent:
            bad += 1
    ok_rank = isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 16
    return KvBatch(
        ts=float(ts) if isinstance(ts, int | float) and _finite(ts) else 0.0,
        events=tuple(good),
        rank=rank if ok_rank else None,
        bad=bad,
    )
