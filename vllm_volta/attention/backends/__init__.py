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


def check_window_and_soft_cap(sliding_window: int | None, logits_soft_cap: float | None) -> None:
    """Reject a sliding window that is not a positive int and a soft cap that is not > 0."""
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be > 0 or None, got {logits_soft_cap!r}")


class AttentionImplBase:
    """Head bookkeeping every backend impl shares (the impl contract's constructor).

    ``sliding_window``: a query at position p sees the keys at p - sliding_window + 1 .. p (itself
    and the window - 1 before it, as transformers' sliding-window layers), or all keys up to p
    when None. ``logits_soft_cap``: scores s (already scaled) become cap * tanh(s / cap) before
    the softmax (Gemma 2), or stay as they are when None.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, *,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None) -> None:
        check_window_and_soft_cap(sliding_window, logits_soft_cap)
        self.num_queries_per_kv = check_head_grouping(num_heads, num_kv_heads)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        # An FP8 KV cache holds key / scale and value / scale (attention/kv_cache_dtype.py):
        # the checkpoint's per-layer scales when it has them (set by the weight loader), else 1.
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.kv_scales_from_checkpoint = False
