"""TORCH_SDPA vs a naive per-token softmax attention over the same paged cache."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend
from vllm_volta.attention.metadata import build_attn_metadata
from vllm_volta.platforms.interface import DeviceCapability

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _naive(q, ctx_k, ctx_v, positions, scale, group, window=None, soft_cap=None):
    """q [n, H, D] of tokens at ``positions``; ctx_k/v [L, KH, D] -> [n, H, D], float64. A
    query at p sees keys max(0, p - window + 1) .. p; scores s become cap * tanh(s / cap)."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, pos in enumerate(positions):
        first = 0 if window is None else max(0, pos - window + 1)
        for h in range(q.shape[1]):
            k = ctx_k[first: pos + 1, h // group].double()
            v = ctx_v[first: pos + 1, h // group].double()
            s = k @ q[i, h].double() * scale
            if soft_cap is not None:
                s = soft_cap * torch.tanh(s / soft_cap)
            out[i, h] = torch.softmax(s, dim=0) @ v
    return out


def _case(seqs, num_heads, num_kv_heads, head_size, dtype, device, block_size=4, seed=0, **naive_kw):
    """seqs: list of (num_computed, num_new). Fills a scrambled paged cache with each sequence's
    whole context; returns (query, cache, metadata, expected output)."""
    g = torch.Generator().manual_seed(seed)
    total_blocks = sum(-(-(c + n) // block_size) for c, n in seqs) + 3
    perm = torch.randperm(total_blocks, generator=g).tolist()
    cache = torch.zeros(2, total_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    queries, expected, block_ids = [], [], []
    scale = 1 / math.sqrt(head_size)
    for done, new in seqs:
        length = done + new
        blocks = [perm.pop() for _ in range(-(-length // block_size))]
        block_ids.append(blocks)
        k = torch.randn(length, num_kv_heads, head_size, generator=g).to(dtype)
        v = torch.randn(length, num_kv_heads, head_size, generator=g).to(dtype)
        for p in range(length):  # plain per-slot writes: independent of the code under test
            cache[0, blocks[p // block_size], p % block_size] = k[p]
            cache[1, blocks[p // block_size], p % block_size] = v[p]
        q = torch.randn(new, num_heads, head_size, generator=g).to(dtype)
        queries.append(q)
        expected.append(_naive(q, k, v, range(done, length), scale,
                               num_heads // num_kv_heads, **naive_kw))
    md = build_attn_metadata([c for c, _ in seqs], [n for _, n in seqs], block_ids, block_size,
                             device)
    query = torch.cat(queries).reshape(-1, num_heads * head_size)
    return query.to(device), cache.to(device), md, torch.cat(expected), scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
@pytest.mark.parametrize("heads,kv_heads,head_size", [(4, 4, 16), (8, 2, 32), (6, 1, 24)])
def test_mixed_batch_matches_naive(device, dtype, atol, heads, kv_heads, head_size):
    # decode, fresh prefill, chunked prefill continuation, prefix hit, another decode.
    seqs = [(9, 1), (0, 7), (5, 6), (8, 3), (16, 1)]
    q, cache, md, expected, scale = _case(seqs, heads, kv_heads, head_size, dtype, device)
    impl = TorchSDPABackend.get_impl_cls()(heads, head_size, scale, kv_heads)
    out = impl.forward(q, q.new_empty(0), q.new_empty(0), cache, md)
    assert out.shape == q.shape and out.dtype == dtype
    got = out.view(-1, heads, head_size).double().cpu()
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window,soft_cap", [(3, None), (None, 0.8), (5, 1.5), (1, None)])
def test_sliding_window_and_soft_cap(device, window, soft_cap):
    # Windows shorter than most contexts; soft caps small enough to change the softmax.
    seqs = [(9, 1), (0, 7), (5, 6), (8, 3), (16, 1)]
    q, cache, md, expected, scale = _case(seqs, 8, 2, 16, torch.float32, device, seed=5,
                                          window=window, soft_cap=soft_cap)
    impl = TorchSDPABackend.get_impl_cls()(8, 16, scale, 2, sliding_window=window,
                                          logits_soft_cap=soft_cap)
    out = impl.forward(q, None, None, cache, md).view(-1, 8, 16).double().cpu()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    plain = _case(seqs, 8, 2, 16, torch.float32, device, seed=5)[3]
    assert (expected - plain).abs().max() > 1e-2  # the window / cap changed the result


def test_rejects_bad_window_and_soft_cap():
    impl_cls = TorchSDPABackend.get_impl_cls()
    for kw, field in (({"sliding_window": 0}, "sliding_window"), ({"sliding_window": 2.5}, "sliding_window"),
                      ({"logits_soft_cap": 0.0}, "logits_soft_cap"), ({"logits_soft_cap": -1.0}, "logits_soft_cap")):
        with pytest.raises(ValueError, match=field):
            impl_cls(4, 8, 0.3, 2, **kw)


def test_only_decodes_and_only_prefills():
    for seqs in ([(3, 1), (0, 1), (12, 1)], [(0, 5), (4, 2)]):
        q, cache, md, expected, scale = _case(seqs, 4, 2, 8, torch.float32, "cpu", seed=3)
        out = TorchSDPABackend.get_impl_cls()(4, 8, scale, 2).forward(q, None, None, cache, md)
        torch.testing.assert_close(out.view(-1, 4, 8).double(), expected, atol=1e-5, rtol=1e-4)


def test_validate():
    v = TorchSDPABackend.validate
    assert v(capability=None, dtype=torch.float32, head_size=80, device_type="cpu") == []
    assert v(capability=DeviceCapability(7, 0), dtype=torch.float16, head_size=256,
             device_type="cuda") == []
    assert v(capability=DeviceCapability(9, 0), dtype=torch.bfloat16, head_size=64,
             device_type="cuda") == []
    reasons = v(capability=DeviceCapability(7, 0), dtype=torch.bfloat16, head_size=64,
                device_type="cuda")
    assert len(reasons) == 1 and "8.0" in reasons[0]
    assert v(capability=None, dtype=torch.int8, head_size=64, device_type="cpu")
    assert TorchSDPABackend.name == "TORCH_SDPA"


def test_rejects_bad_head_grouping():
    with pytest.raises(ValueError, match="num_kv_heads"):
        TorchSDPABackend.get_impl_cls()(6, 16, 0.25, 4)
