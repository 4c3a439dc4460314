"""Attention backends. Each module holds one backend class with ``name``, ``validate(...)`` and
``get_impl_cls()`` (contract in docs/ARCHITECTURE.md); the platform layer picks one by priority.

- ``torch_sdpa.TorchSDPABackend`` (TORCH_SDPA): plain PyTorch, any device and dtype.
- ``volta_paged`` (VOLTA_PAGED): CUDA paged attention, SM70+.

Modules are imported by the platform's selector on demand, not here, so a backend that cannot
import on this machine does not break the others.
"""

from __future__ import annotations


def check_head_grouping(num_heads: int, num_kv_heads: int) -> int:
    """Validate grouped-query head counts; returns the query heads per kv head."""
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    return num_heads // num_kv_heads


class AttentionImplBase:
    """Head bookkeeping every backend impl shares (the impl contract's constructor)."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        self.num_queries_per_kv = check_head_grouping(num_heads, num_kv_heads)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
