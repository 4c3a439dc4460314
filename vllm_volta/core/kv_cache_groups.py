"""KV-cache groups: which paged layers share a block table, and how their memory is laid out.

A model's paged layers (core/kv_cache_spec.py) fall into kinds: full attention, or a sliding
window of W tokens (and, within a kind, one size of a token's keys + values). Each kind's layers
are split into groups of equal size (the smallest kind's layer count; the last group of a kind
may be smaller), and each group has its own block table per request, from one pool of block
ids. Position j of every group uses the same buffer: ``num_blocks`` pages of ``page_bytes``
each, which layer j of group g views as ``[2, num_blocks, block_size_g, kv_heads, head_size]``.
A group's block size makes its page exactly ``page_bytes`` ("unify the page size": sliding layers
of 16 KV heads x 256 at 16 tokens, full layers of 4 x 512 at 32), so a block id names the same
bytes in every buffer and belongs to one group's table at a time. Sliding groups return the
blocks that fall out of their window, so a long context costs the full layers only.

One group (every layer full, or every layer the same window) is today's layout: one tensor per
layer, one table. Where the page sizes cannot be unified, every layer keeps every token in one
shared table (``note`` says why). These are vLLM's hybrid KV-cache allocator's ideas
(``KVCacheGroupSpec``); the code is ours.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_volta.core.kv_cache_spec import (FullAttentionSpec, KVCacheSpec, MambaSpec, SharedKVSpec,
                                           SlidingWindowSpec, allocate_caches, is_paged)


MAX_BLOCK_SIZE = 256  # CacheConfig's bound on block_size


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table: their block size and window (None: full attention)."""

    block_size: int
    sliding_window: int | None
    layers: tuple[int, ...]  # indices into the model's kv_caches list

    def blocks_needed(self, num_tokens: int, max_step_tokens: int | None = None) -> int:
        """Most blocks one request of ``num_tokens`` tokens holds in this group at once: all of
        them for full attention; for a window, the window before a step's first token plus the
        step's tokens (at most ``max_step_tokens``), plus one block of misalignment."""
        full = cdiv(num_tokens, self.block_size)
        if self.sliding_window is None or max_step_tokens is None:
            return full
        return min(full, cdiv(self.sliding_window - 1 + max_step_tokens, self.block_size) + 1)


@dataclass(frozen=True)
class KVCacheLayout:
    """The groups of one model's paged layers and the buffers behind them."""

    groups: tuple[KVCacheGroup, ...]
    layer_group: tuple[int, ...]  # per kv_caches entry: its group, -1 for recurrent-state layers
    page_bytes: int  # bytes of one block in one buffer (0: per-layer tensors, no shared buffers)
    note: str = ""  # why the layout fell back to one shared table, if it did

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def frees_blocks(self) -> bool:
        """Whether some group returns blocks that fall out of its window."""
        return any(g.sliding_window is not None for g in self.groups)

    @property
    def group_size(self) -> int:
        """Buffers behind the groups: the largest group's layer count."""
        return max((len(g.layers) for g in self.groups), default=0)

    def block_bytes(self, specs: Sequence[KVCacheSpec]) -> int:
        """Bytes one block id takes across the whole cache."""
        if self.page_bytes:
            return self.group_size * self.page_bytes
        bs = self.groups[0].block_size
        return sum(specs[i].page_bytes(bs) for i in self.groups[0].layers)

    def blocks_per_request(self, num_tokens: int, max_step_tokens: int | None = None) -> int:
        """Blocks one request of ``num_tokens`` tokens holds at most, over every group."""
        return sum(g.blocks_needed(num_tokens, max_step_tokens) for g in self.groups)


def _check_shared(specs: Sequence[KVCacheSpec]) -> None:
    for i, spec in enumerate(specs):
        if isinstance(spec, SharedKVSpec) and not (0 <= spec.source < i and is_paged(specs[spec.source])):
            raise ValueError(f"layer {i}: SharedKVSpec.source must name an earlier paged layer, "
                             f"got {spec.source}")


def _window(spec: FullAttentionSpec, max_model_len: int | None) -> int | None:
    """The layer's window, None where it has none or it spans every context (nothing to free)."""
    if not isinstance(spec, SlidingWindowSpec) or spec.sliding_window <= 0:
        return None
    if max_model_len is not None and spec.sliding_window >= max_model_len:
        return None
    return spec.sliding_window


def _one_table(specs: Sequence[KVCacheSpec], paged: list[int], block_size: int, window: int | None,
               note: str = "") -> KVCacheLayout:
    group = KVCacheGroup(block_size, window, tuple(paged))
    return KVCacheLayout((group,), _layer_groups(specs, {i: 0 for i in paged}), 0, note)


def _layer_groups(specs: Sequence[KVCacheSpec], group_of: dict[int, int]) -> tuple[int, ...]:
    return tuple(-1 if isinstance(s, MambaSpec) else group_of[s.source if isinstance(s, SharedKVSpec) else i]
                 for i, s in enumerate(specs))


def single_table_layout(specs: Sequence[KVCacheSpec], block_size: int, note: str = "") -> KVCacheLayout:
    """Today's layout: every paged layer in one table of ``block_size``, keeping every token."""
    _check_shared(specs)
    return _one_table(specs, [i for i, s in enumerate(specs) if is_paged(s)], block_size, None, note)


def plan_kv_cache_groups(specs: Sequence[KVCacheSpec], block_size: int,
                         max_model_len: int | None = None) -> KVCacheLayout:
    """Group the paged layers of ``specs`` (block_size: the configured tokens per block, the
    block size of the kind with the largest pages). Windows of ``max_model_len`` tokens or more
    count as full attention: they never free a block, and one table keeps prefix caching."""
    _check_shared(specs)
    paged = [i for i, s in enumerate(specs) if is_paged(s)]
    kinds: dict[tuple[int | None, int], list[int]] = {}
    for i in paged:
        kinds.setdefault((_window(specs[i], max_model_len), specs[i].page_bytes(1)), []).append(i)
    windows = {w for w, _ in kinds}
    if windows <= {None}:  # nothing slides: one table, every layer its own shape
        return _one_table(specs, paged, block_size, None)
    if len(kinds) == 1:
        return _one_table(specs, paged, block_size, next(iter(windows)))
    # The largest kind's page at block_size; where that is not a whole multiple of block_size
    # tokens of another kind, block_size x the least common multiple (block sizes stay multiples
    # of block_size, the decode kernel's fast path).
    token_sizes = sorted({tb for _, tb in kinds})
    page = block_size * token_sizes[-1]
    if any(token_sizes[-1] % tb for tb in token_sizes):
        page = block_size * math.lcm(*token_sizes)
    if page // token_sizes[0] > MAX_BLOCK_SIZE:
        return _one_table(specs, paged, block_size, None,
                          f"per-token cache sizes {token_sizes} bytes need pages of {page} bytes, "
                          f"blocks of {page // token_sizes[0]} tokens (at most {MAX_BLOCK_SIZE})")
    group_size = min(len(layers) for layers in kinds.values())
    groups, group_of = [], {}
    # Full kinds first: group 0 is then a full table where the model has one.
    for (window, token_bytes), layers in sorted(kinds.items(), key=lambda kv: (kv[0][0] is not None, kv[0])):
        for start in range(0, len(layers), group_size):
            chunk = tuple(layers[start:start + group_size])
            group_of.update((i, len(groups)) for i in chunk)
            groups.append(KVCacheGroup(page // token_bytes, window, chunk))
    return KVCacheLayout(tuple(groups), _layer_groups(specs, group_of), page)


def allocate_group_caches(specs: Sequence[KVCacheSpec], layout: KVCacheLayout, num_blocks: int,
                          num_state_slots: int, device: torch.device) -> list:
    """One entry per spec, as allocate_caches, with layer j of every group a view of buffer j.
    Zeros: block 0 (the null block in freed table entries) is read, masked, by the kernels."""
    if not layout.page_bytes:
        return allocate_caches(specs, num_blocks, layout.groups[0].block_size, num_state_slots, device)
    buffers = [torch.zeros(num_blocks * layout.page_bytes, dtype=torch.uint8, device=device)
               for _ in range(layout.group_size)]
    caches: list = [None] * len(specs)
    for i, spec in enumerate(specs):
        if isinstance(spec, MambaSpec):
            caches[i] = tuple(torch.zeros((num_state_slots, *shape), dtype=dtype, device=device)
                              for shape, dtype in zip(spec.shapes, spec.dtypes))
    for group in layout.groups:
        for j, i in enumerate(group.layers):
            spec = specs[i]
            caches[i] = buffers[j].view(spec.dtype).view(spec.cache_shape(num_blocks, group.block_size))
    for i, spec in enumerate(specs):
        if isinstance(spec, SharedKVSpec):  # plan_kv_cache_groups checked the source
            caches[i] = caches[spec.source]
    return caches
