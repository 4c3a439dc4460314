"""Prefix caching over KV-cache groups: which cached blocks a new request may adopt.

Every group registers its full blocks under the request's chained block hash (which names the
whole prefix up to the block's end) tagged with the group, so group g's block for a prefix is
found as (hash, g). A hit of ``h`` tokens is valid only when each full-attention group has every
block of the first ``h`` tokens and each sliding group has the blocks of the window before the
hit point (positions ``h - W + 1 .. h - 1``: the next token reads them); the blocks before that
window may be gone (their table entries are the null block). ``h`` is a multiple of every
group's block size. A hit never changes the tokens: the KV in those blocks is what the request
would compute.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from vllm_volta.core.block_hash import BlockHash
from vllm_volta.core.block_pool import BlockPool, KVCacheBlock
from vllm_volta.core.kv_cache_groups import KVCacheGroup
from vllm_volta.core.request import Request

# Per group: the hit's table (null block where the window no longer reaches).
GroupHits = tuple[list[KVCacheBlock], ...]


def group_key(block_hash: BlockHash, group: int) -> BlockHash:
    """The prefix-cache key of group ``group``'s block for the prefix ``block_hash`` names."""
    return block_hash + group.to_bytes(2, "little")


def block_key(hashes: Sequence[BlockHash], request_block_size: int, group: int, block_size: int,
              index: int) -> BlockHash | None:
    """Key of block ``index`` of a group of ``block_size`` (a multiple of the request's hash
    block size), None while the request's tokens do not fill it."""
    end = (index + 1) * (block_size // request_block_size)
    return group_key(hashes[end - 1], group) if end <= len(hashes) else None


def find_hits(pool: BlockPool, groups: Sequence[KVCacheGroup], request: Request) -> tuple[GroupHits, int]:
    """The longest valid hit for ``request`` (leaving at least one token to compute)."""
    base = request.block_size
    if any(g.block_size % base for g in groups):
        return (), 0
    hashes = request.block_hashes
    step = math.lcm(*(g.block_size for g in groups))
    hit = (request.num_tokens - 1) // step * step

    def cached(g: int, index: int) -> KVCacheBlock | None:
        key = block_key(hashes, base, g, groups[g].block_size, index)
        return None if key is None else pool.get_cached_block(key)

    for g, group in enumerate(groups):  # full groups: the longest run from the start
        if group.sliding_window is None:
            n = 0
            while n < hit // group.block_size and cached(g, n) is not None:
                n += 1
            hit = min(hit, n * group.block_size // step * step)

    def window_blocks(g: int, h: int) -> range:
        bs, window = groups[g].block_size, groups[g].sliding_window
        return range(max(h - window + 1, 0) // bs, h // bs)

    sliding = [g for g, group in enumerate(groups) if group.sliding_window is not None]
    while hit > 0 and not all(cached(g, i) is not None for g in sliding for i in window_blocks(g, hit)):
        hit -= step
    if hit == 0:
        return (), 0
    tables = []
    for g, group in enumerate(groups):
        n = hit // group.block_size
        first = 0 if group.sliding_window is None else window_blocks(g, hit).start
        tables.append([pool.null_block] * first + [cached(g, i) for i in range(first, n)])
    return tuple(tables), hit
