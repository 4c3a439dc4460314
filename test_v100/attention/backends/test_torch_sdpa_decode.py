"""TORCH_SDPA's decode batch: equal-length rows (the unmasked path), padded rows, rows that are not
the step's first tokens, grouped-query heads, against the naive per-token reference."""

from __future__ import annotations

import pytest
import torch

from test_v100.attention.backends.test_torch_sdpa import DEVICES, _case
from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend

_SHAPES = [(9, 3, 16), (4, 4, 8), (6, 1, 24)]  # (heads, kv_heads, head_size): SmolLM2's 3:1 grouping first


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,head_size", _SHAPES)
@pytest.mark.parametrize("seqs", [
    [(11, 1)] * 5,  # equal contexts: no padding, SDPA runs without a mask
    [(3, 1), (20, 1), (0, 1), (15, 1)],  # padded to the longest, block-0 padding masked
    [(0, 6), (7, 1), (4, 3), (12, 1)],  # decode rows after / between prefills
])
def test_decode_rows_match_naive(device, dtype, atol, heads, kv_heads, head_size, seqs):
    q, cache, md, expected, scale = _case(seqs, heads, kv_heads, head_size, dtype, device, seed=7)
    out = TorchSDPABackend.get_impl_cls()(heads, head_size, scale, kv_heads).forward(q, None, None, cache, md)
    assert out.dtype == dtype
    torch.testing.assert_close(out.view(-1, heads, head_size).double().cpu(), expected, atol=atol, rtol=1e-2)


@pytest.mark.parametrize("window,soft_cap", [(None, 0.7), (4, None), (4, 1.2)])
def test_equal_length_decodes_keep_window_and_soft_cap(window, soft_cap):
    # All rows valid before the window: the mask (window) and the cap must still apply.
    seqs = [(13, 1)] * 4
    q, cache, md, expected, scale = _case(seqs, 9, 3, 16, torch.float32, "cpu", seed=2,
                                          window=window, soft_cap=soft_cap)
    impl = TorchSDPABackend.get_impl_cls()(9, 16, scale, 3, sliding_window=window, logits_soft_cap=soft_cap)
    out = impl.forward(q, None, None, cache, md).view(-1, 9, 16).double()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    plain = _case(seqs, 9, 3, 16, torch.float32, "cpu", seed=2)[3]
    assert (expected - plain).abs().max() > 1e-2  # the window / cap changed the result
