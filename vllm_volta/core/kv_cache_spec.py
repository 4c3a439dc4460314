"""What each layer keeps between steps: its cache spec.

A model lists one spec per entry of the ``kv_caches`` list its forward takes
(``model.kv_cache_specs()``; models without the method get a FullAttentionSpec per layer from
the model config). The model runner allocates each entry from its spec, the worker sizes the
cache from the specs' bytes, and the scheduler's KV cache manager hands out what the specs
need per request:

- FullAttentionSpec / SlidingWindowSpec: paged keys and values, ``[2, num_blocks, block_size,
  num_kv_heads, head_size]``, addressed through the request's block table. Layers of different
  head sizes or KV-head counts each get their own shape. Where some layers slide, the layers
  form KV-cache groups (core/kv_cache_groups.py), each with its own block table and block size,
  and a sliding group returns the blocks that leave its window; otherwise every layer shares
  one block table.
- SharedKVSpec: the layer reads another layer's cache and writes none (the entry IS that
  layer's tensor).
- MambaSpec: a recurrent state per running request (Gated DeltaNet's conv and SSM states): one
  tensor per entry of ``shapes``, ``[num_state_slots, *shape]``; the request's slot comes from
  ``AttentionMetadata.state_slots``. Slot 0 is scratch (padded rows of CUDA graphs write it),
  never a request's.

These are vLLM's names for the same idea (``KVCacheSpec`` and its subclasses).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class FullAttentionSpec:
    """Paged keys and values for every token of the context."""

    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    def page_bytes(self, block_size: int) -> int:
        """Bytes one block takes in this layer (keys and values)."""
        return 2 * block_size * self.num_kv_heads * self.head_size * _itemsize(self.dtype)

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_size)


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Paged keys and values of which attention reads the last ``sliding_window`` tokens."""

    sliding_window: int = 0


@dataclass(frozen=True)
class SharedKVSpec:
    """The cache of layer ``source`` (an index into the same list), read, never written."""

    source: int


@dataclass(frozen=True)
class MambaSpec:
    """A fixed-size recurrent state per request: one tensor per shape (per slot)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    def slot_bytes(self) -> int:
        return sum(math.prod(s) * _itemsize(d) for s, d in zip(self.shapes, self.dtypes))


KVCacheSpec = FullAttentionSpec | SharedKVSpec | MambaSpec


def is_paged(spec: KVCacheSpec) -> bool:
    return isinstance(spec, FullAttentionSpec)


def block_bytes(specs: Sequence[KVCacheSpec], block_size: int) -> int:
    """Bytes one block takes across every paged layer."""
    return sum(s.page_bytes(block_size) for s in specs if is_paged(s))


def state_slot_bytes(specs: Sequence[KVCacheSpec]) -> int:
    """Bytes one request's recurrent state takes across every recurrent layer."""
    return sum(s.slot_bytes() for s in specs if isinstance(s, MambaSpec))


def has_recurrent_state(specs: Sequence[KVCacheSpec]) -> bool:
    return any(isinstance(s, MambaSpec) for s in specs)


def allocate_caches(specs: Sequence[KVCacheSpec], num_blocks: int, block_size: int,
                    num_state_slots: int, device: torch.device) -> list:
    """One entry per spec: a paged tensor, the source layer's tensor, or a tuple of state
    tensors. Zeros: padded attention reads masked slots (0 * NaN garbage is NaN), and slot 0's
    state must stay finite."""
    caches: list = []
    for i, spec in enumerate(specs):
        if isinstance(spec, SharedKVSpec):
            if not 0 <= spec.source < i or not is_paged(specs[spec.source]):
                raise ValueError(f"layer {i}: SharedKVSpec.source must name an earlier paged "
                                 f"layer, got {spec.source}")
            caches.append(caches[spec.source])
        elif isinstance(spec, MambaSpec):
            caches.append(tuple(torch.zeros((num_state_slots, *shape), dtype=dtype, device=device)
                                for shape, dtype in zip(spec.shapes, spec.dtypes)))
        else:
            caches.append(torch.zeros(spec.cache_shape(num_blocks, block_size), dtype=spec.dtype,
                                      device=device))
    return caches
