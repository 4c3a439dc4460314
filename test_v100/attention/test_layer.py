"""Attention layer: cache writes by slot (skipping -1) and the call into the backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.attention.layer import Attention, write_to_kv_cache
from vllm_volta.attention.metadata import build_attn_metadata


def test_write_to_kv_cache_by_slot():
    cache = torch.zeros(2, 3, 4, 2, 8)
    k, v = torch.randn(3, 16), torch.randn(3, 16)
    write_to_kv_cache(k, v, cache, torch.tensor([5, -1, 11]))
    expected = torch.zeros_like(cache)
    expected[0, 1, 1], expected[1, 1, 1] = k[0].view(2, 8), v[0].view(2, 8)  # slot 5
    expected[0, 2, 3], expected[1, 2, 3] = k[2].view(2, 8), v[2].view(2, 8)  # slot 11
    assert torch.equal(cache, expected)


def test_write_casts_to_cache_dtype():
    cache = torch.zeros(2, 1, 2, 1, 4, dtype=torch.float16)
    k = torch.randn(1, 4)
    write_to_kv_cache(k, k, cache, torch.tensor([1]))
    assert torch.equal(cache[0, 0, 1, 0], k[0].half())


def test_attention_layer_prefill_then_decode():
    """Prefill 5 tokens, decode 1: outputs equal causal SDPA over the 6-token sequence."""
    heads, kv_heads, d = 4, 2, 8
    torch.manual_seed(0)
    q, k, v = torch.randn(6, heads * d), torch.randn(6, kv_heads * d), torch.randn(6, kv_heads * d)
    layer = Attention(heads, d, d ** -0.5, kv_heads)
    cache = torch.zeros(2, 4, 4, kv_heads, d)
    out1 = layer(q[:5], k[:5], v[:5], cache, build_attn_metadata([0], [5], [[3, 1]], 4))
    out2 = layer(q[5:], k[5:], v[5:], cache, build_attn_metadata([5], [1], [[3, 1]], 4))
    ref = F.scaled_dot_product_attention(
        q.view(6, heads, d).transpose(0, 1),
        k.view(6, kv_heads, d).transpose(0, 1).repeat_interleave(2, 0),
        v.view(6, kv_heads, d).transpose(0, 1).repeat_interleave(2, 0),
        is_causal=True).transpose(0, 1).reshape(6, heads * d)
    torch.testing.assert_close(torch.cat([out1, out2]), ref, atol=1e-5, rtol=1e-5)


def test_invalid_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(4, 8, 0.3, 3)


def test_impl_may_provide_its_own_cache_write():
    calls = []

    class Impl:
        def __init__(self, *args, sliding_window=None, logits_soft_cap=None):
            self.sliding_window, self.logits_soft_cap = sliding_window, logits_soft_cap

        def write_to_kv_cache(self, key, value, kv_cache, slot_mapping):
            calls.append(slot_mapping.tolist())

        def forward(self, query, key, value, kv_cache, attn_metadata):
            return query

    backend = type("FakeBackend", (), {"name": "FAKE", "get_impl_cls": staticmethod(lambda: Impl)})
    layer = Attention(2, 4, 0.5, 2, backend)
    cache = torch.zeros(2, 2, 4, 2, 4)
    q = torch.randn(3, 8)
    out = layer(q, q, q, cache, build_attn_metadata([0], [3], [[1]], 4))
    assert out is q and calls == [[4, 5, 6]] and not cache.any()  # default write not used


def test_rope_is_applied_before_the_cache_write():
    """rope=(rotary_emb, positions): the layer rotates q/k (CPU: forward_native), then writes the
    rotated key; outputs equal rotating first and calling the layer without it."""
    from vllm_volta.model_executor.layers.rotary_embedding import get_rope

    heads, kv_heads, d = 4, 2, 8
    torch.manual_seed(1)
    rope = get_rope(d, d, 64, 10000.0, True)
    q, k, v = torch.randn(5, heads * d), torch.randn(5, kv_heads * d), torch.randn(5, kv_heads * d)
    positions = torch.arange(5)
    md = build_attn_metadata([0], [5], [[3, 1]], 4)
    layer = Attention(heads, d, d ** -0.5, kv_heads)
    cache, ref_cache = torch.zeros(2, 4, 4, kv_heads, d), torch.zeros(2, 4, 4, kv_heads, d)
    out = layer(q, k, v, cache, md, rope=(rope, positions))
    q_rot, k_rot = rope.forward_native(positions, q, k)
    ref = layer(q_rot, k_rot, v, ref_cache, md)
    assert torch.equal(out, ref) and torch.equal(cache, ref_cache)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_volta_paged_rope_and_cache_write_in_one_kernel(monkeypatch):
    """VOLTA_PAGED applies RoPE with rotary_embedding_and_cache (one slot per token); the
    output and the cache equal the separate rotary + cache-write path."""
    from vllm_volta import _custom_ops as ops
    from vllm_volta.attention.backends.volta_paged import VoltaPagedBackend
    from vllm_volta.model_executor.layers.rotary_embedding import get_rope

    calls = []
    real = ops.rotary_embedding_and_cache
    monkeypatch.setattr(ops, "rotary_embedding_and_cache", lambda *a: calls.append(1) or real(*a))
    heads, kv_heads, d = 8, 2, 64
    torch.manual_seed(2)
    rope = get_rope(d, d, 64, 10000.0, True).cuda()
    layer = Attention(heads, d, d ** -0.5, kv_heads, VoltaPagedBackend)
    q, k, v = (torch.randn(7, n * d, dtype=torch.float16, device="cuda") for n in (heads, kv_heads, kv_heads))
    positions = torch.arange(7, device="cuda")
    md = build_attn_metadata([0], [7], [[3, 1]], 4, device="cuda")
    cache, ref_cache = (torch.zeros(2, 4, 4, kv_heads, d, dtype=torch.float16, device="cuda") for _ in range(2))
    q_ref, k_ref = q.clone(), k.clone()
    out = layer(q, k, v, cache, md, rope=(rope, positions))
    assert calls == [1]
    q_ref, k_ref = rope(positions, q_ref, k_ref)
    ref = layer(q_ref, k_ref, v, ref_cache, md)
    assert torch.equal(out, ref) and torch.equal(cache, ref_cache)
