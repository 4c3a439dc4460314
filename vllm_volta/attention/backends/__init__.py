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
