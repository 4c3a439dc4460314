"""Attention layer: stores the new keys/values in the paged KV cache, then runs the backend."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vllm_volta.attention.backends import check_head_grouping
from vllm_volta.attention.kv_cache_dtype import is_fp8, quantize
from vllm_volta.attention.metadata import AttentionMetadata


def write_to_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write ``key``/``value`` ([T, KH*D] or [T, KH, D]) into ``kv_cache`` at ``slot_mapping``.

    ``kv_cache`` is ``[2, num_blocks, block_size, KH, D]``; slot ``s`` is block ``s // block_size``,
    offset ``s % block_size``. Slots of -1 (padding tokens) are skipped. An FP8 cache gets
    ``key / k_scale`` and ``value / v_scale``, rounded to nearest even and saturated.
    """
    num_kv_heads, head_size = kv_cache.shape[-2], kv_cache.shape[-1]
    # view (not reshape): the write must land in the cache's own storage.
    key_cache = kv_cache[0].view(-1, num_kv_heads, head_size)
    value_cache = kv_cache[1].view(-1, num_kv_heads, head_size)
    num_tokens = slot_mapping.shape[0]
    key = key[:num_tokens].reshape(num_tokens, num_kv_heads, head_size)
    value = value[:num_tokens].reshape(num_tokens, num_kv_heads, head_size)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    if is_fp8(kv_cache.dtype):
        key_cache[slots] = quantize(key[valid], k_scale, kv_cache.dtype)
        value_cache[slots] = quantize(value[valid], v_scale, kv_cache.dtype)
        return
    key_cache[slots] = key[valid].to(kv_cache.dtype)
    value_cache[slots] = value[valid].to(kv_cache.dtype)


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged KV cache.

    ``forward(q [T, H*D], k [T, KH*D], v [T, KH*D], kv_cache, attn_metadata) -> [T, H*D]``.
    The backend class (chosen by the platform) provides the attention math; this layer owns the
    cache write so every backend sees the same cache contents. ``sliding_window`` and
    ``logits_soft_cap``: see AttentionImplBase. ``kv_cache_group``: the KV-cache group of the
    layer's cache (core/kv_cache_groups.py; set by the model runner): the layer reads that group's
    block table and slot mapping (``AttentionMetadata.for_group``).
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 backend_cls: type | None = None, *, sliding_window: int | None = None,
                 logits_soft_cap: float | None = None) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_head_grouping(num_heads, num_kv_heads)
        if backend_cls is None:
            from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend
            backend_cls = TorchSDPABackend
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.backend_cls = backend_cls
        self.impl = backend_cls.get_impl_cls()(num_heads, head_size, scale, num_kv_heads,
                                                sliding_window=sliding_window,
                                                logits_soft_cap=logits_soft_cap)
        # A backend with a fused cache-write kernel provides it on the impl, and may provide
        # one that also applies RoPE.
        self._write = getattr(self.impl, "write_to_kv_cache", write_to_kv_cache)
        self._rope_and_write = getattr(self.impl, "rope_and_write_to_kv_cache", None)
        # Set only while piecewise CUDA graphs are captured (worker/piecewise_graph.py): called
        # instead of this layer, it cuts the capture at the attention.
        self.capture_hook: Callable[..., torch.Tensor] | None = None
        self.kv_cache_group = 0

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata,
                rope: tuple[nn.Module, torch.Tensor] | None = None, kv_cached: bool = False) -> torch.Tensor:
        """``rope`` = (rotary_emb, positions): RoPE to apply to query/key first. It is applied
        here so that a backend can do it in the kernel that writes the cache. ``kv_cached``: the
        projection already rotated query/key and wrote key/value to ``kv_cache``
        (decode_gemv.rope_cache_linear); only the attention itself is left."""
        if self.capture_hook is not None:
            return self.capture_hook(self, query, key, value, kv_cache, rope, kv_cached)
        if self.kv_cache_group:
            attn_metadata = attn_metadata.for_group(self.kv_cache_group)
        if kv_cached:
            return self.impl.forward(query, key, value, kv_cache, attn_metadata)
        slot_mapping = attn_metadata.slot_mapping
        if rope is not None:
            rotary_emb, positions = rope
            if (self._rope_and_write is not None and query.is_cuda
                    and slot_mapping.shape[0] == query.shape[0]):
                self._rope_and_write(rotary_emb, positions, query, key, value, kv_cache, slot_mapping)
                return self.impl.forward(query, key, value, kv_cache, attn_metadata)
            query, key = rotary_emb(positions, query, key)
        if is_fp8(kv_cache.dtype):  # the layer's scales (a write of another cache takes none)
            self._write(key, value, kv_cache, slot_mapping, self.impl.k_scale, self.impl.v_scale)
        else:
            self._write(key, value, kv_cache, slot_mapping)
        return self.impl.forward(query, key, value, kv_cache, attn_metadata)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k in ("sliding_window", "logits_soft_cap")
                        if (v := getattr(self.impl, k)) is not None)
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_size={self.head_size}, "
                f"backend={getattr(self.backend_cls, 'name', self.backend_cls.__name__)}{extra}")
