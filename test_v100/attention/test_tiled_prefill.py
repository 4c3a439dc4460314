"""Tiled prefill attention over a paged context (online softmax) against a float64 reference:
cached prefixes, windows, soft caps, GQA, query chunks and key tiles that straddle blocks."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_volta.attention.tiled_prefill import paged_prefill_attention, tile_sizes


def _reference(q, k, v, seq_len, scale, window, soft_cap):
    """float64: q [Lq, H, D], k / v [L, KH, D] (the whole context, in order)."""
    num_q, heads, _ = q.shape
    group = heads // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
    vv = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    s = torch.matmul(q.double().transpose(0, 1), kk.transpose(1, 2)) * scale  # [H, Lq, L]
    if soft_cap is not None:
        s = torch.tanh(s / soft_cap) * soft_cap
    qp = torch.arange(seq_len - num_q, seq_len)[:, None]
    kp = torch.arange(seq_len)[None, :]
    mask = kp <= qp
    if window is not None:
        mask &= kp > qp - window
    s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(s.softmax(-1), vv).transpose(0, 1)  # [Lq, H, D]


def _paged(k, block_size, num_blocks, gen):
    """Scatter a context [L, KH, D] over random blocks: (cache, block table row)."""
    seq_len, kv_heads, d = k.shape
    nb = -(-seq_len // block_size)
    blocks = torch.randperm(num_blocks, generator=gen)[:nb]
    cache = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen, dtype=k.dtype)
    flat = cache[blocks].flatten(0, 1)
    flat[:seq_len] = k
    cache[blocks] = flat.view(nb, block_size, kv_heads, d)
    return cache, blocks


@pytest.mark.parametrize("num_q,seq_len", [(1, 1), (7, 7), (5, 300), (64, 1000), (100, 333)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (37, None), (200, 50.0)])
# 24 KiB: chunks of a few dozen query rows over tiles of one or a few 16-token blocks (a window
# starting mid-tile masks inside a tile); 32 MiB: every query over one tile.
@pytest.mark.parametrize("score_bytes", [24 << 10, 32 << 20])
def test_matches_float64_reference(num_q, seq_len, heads, kv_heads, window, soft_cap, score_bytes):
    gen = torch.Generator().manual_seed(num_q * 1000 + seq_len)
    d, block_size = 16, 16
    q = torch.randn(num_q, heads, d, generator=gen)
    k = torch.randn(seq_len, kv_heads, d, generator=gen)
    v = torch.randn(seq_len, kv_heads, d, generator=gen)
    kc, blocks = _paged(k, block_size, 80, gen)
    vc = kc.clone()
    flat = vc[blocks].flatten(0, 1)
    flat[:seq_len] = v
    vc[blocks] = flat.view(-1, block_size, kv_heads, d)
    scale = 1 / math.sqrt(d)
    got = paged_prefill_attention(q, kc, vc, blocks, seq_len, scale, window=window, soft_cap=soft_cap,
                                  score_bytes=score_bytes)
    ref = _reference(q, k, v, seq_len, scale, window, soft_cap)
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_keep_fp32_math(dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(33, 8, 32, generator=gen).to(dtype)
    k = torch.randn(500, 2, 32, generator=gen).to(dtype)
    v = torch.randn(500, 2, 32, generator=gen).to(dtype)
    kc, blocks = _paged(k, 16, 40, gen)
    vc = kc.clone()
    flat = vc[blocks].flatten(0, 1)
    flat[:500] = v
    vc[blocks] = flat.view(-1, 16, 2, 32)
    got = paged_prefill_attention(q, kc, vc, blocks, 500, 0.2, score_bytes=1 << 14)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), _reference(q, k, v, 500, 0.2, None, None),
                               atol=1e-2, rtol=1e-2)


def test_tile_sizes_fit_the_budget():
    for num_q, heads, seq_len in [(1, 32, 131072), (512, 32, 131072), (8192, 32, 8192), (131072, 32, 131072)]:
        rows, keys = tile_sizes(num_q, heads, seq_len, 16, 32 << 20)
        assert keys % 16 == 0 and 1 <= rows <= num_q
        assert rows * heads * keys * 4 <= 32 << 20
    assert tile_sizes(512, 32, 131072, 16, 32 << 20) == (512, 512)  # every query, 512-key tiles
    assert tile_sizes(1, 32, 100, 16, 32 << 20)[1] == 96  # never longer than the context (whole blocks)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without FP8 dtypes")
def test_fp8_cache_is_read_times_its_scales():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(9, 4, 32, generator=gen)
    k = torch.randn(100, 2, 32, generator=gen)
    v = torch.randn(100, 2, 32, generator=gen)
    kc, blocks = _paged(k / 0.5, 16, 12, gen)
    vc = kc.clone()
    flat = vc[blocks].flatten(0, 1)
    flat[:100] = v / 0.25
    vc[blocks] = flat.view(-1, 16, 2, 32)
    kc8, vc8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    got = paged_prefill_attention(q, kc8, vc8, blocks, 100, 0.2, k_scale=0.5, v_scale=0.25)
    # The reference reads the same FP8 values, dequantized by hand.
    k8 = kc8[blocks].flatten(0, 1)[:100].double() * 0.5
    v8 = vc8[blocks].flatten(0, 1)[:100].double() * 0.25
    torch.testing.assert_close(got.double(), _reference(q, k8, v8, 100, 0.2, None, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_q,seq_len", [(7, 7), (64, 1000), (100, 333)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_explicit_tiles_without_window_match_the_fused_cpu_path(num_q, seq_len, dtype, monkeypatch):
    """Off CPU (and with a window or cap) the explicit tiles run: without them here too, both
    paths against the float64 reference."""
    from vllm_volta.attention import tiled_prefill

    gen = torch.Generator().manual_seed(seq_len)
    q = torch.randn(num_q, 6, 32, generator=gen).to(dtype)
    k = torch.randn(seq_len, 2, 32, generator=gen).to(dtype)
    v = torch.randn(seq_len, 2, 32, generator=gen).to(dtype)
    kc, blocks = _paged(k, 16, 80, gen)
    vc = kc.clone()
    flat = vc[blocks].flatten(0, 1)
    flat[:seq_len] = v
    vc[blocks] = flat.view(-1, 16, 2, 32)
    ref = _reference(q, k, v, seq_len, 0.2, None, None)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    fused = paged_prefill_attention(q, kc, vc, blocks, seq_len, 0.2, score_bytes=1 << 14)
    monkeypatch.setattr(tiled_prefill, "_FUSED_CPU", None)
    explicit = paged_prefill_attention(q, kc, vc, blocks, seq_len, 0.2, score_bytes=1 << 14)
    torch.testing.assert_close(fused.double(), ref, **tol)
    torch.testing.assert_close(explicit.double(), ref, **tol)
