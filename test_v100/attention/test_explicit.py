"""attention/explicit.py: the masks and the soft-capped prefill (chunked over queries) against a
float64 per-query reference."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.attention import explicit


def _reference(q, k, v, scale, cap, window):
    """q [Lq, H, D] (the last Lq of Lk positions), k / v [Lk, H, D] -> [Lq, H, D], float64."""
    q_len, seq_len = q.shape[0], k.shape[0]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q_len):
        pos = seq_len - q_len + j
        first = 0 if window is None else max(0, pos - window + 1)
        s = torch.einsum("hd,nhd->hn", q[j].double(), k[first:pos + 1].double()) * scale
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        out[j] = torch.einsum("hn,nhd->hd", s.softmax(-1), v[first:pos + 1].double())
    return out


def test_context_mask():
    assert explicit.context_mask(4, 4, None, "cpu") is None  # plain causal
    mask = explicit.context_mask(2, 5, 3, "cpu")  # queries at 3 and 4, windows of 3
    assert mask.tolist() == [[False, True, True, True, False], [False, False, True, True, True]]


@pytest.mark.parametrize("q_len,seq_len", [(9, 9), (4, 13)])
@pytest.mark.parametrize("window", [None, 3])
def test_soft_capped_prefill_in_many_chunks(monkeypatch, q_len, seq_len, window):
    monkeypatch.setattr(explicit, "_SCORE_BYTES", 4 * 2 * seq_len * 2)  # two queries per chunk
    gen = torch.Generator().manual_seed(0)
    q, k, v = (3 * torch.randn(n, 2, 8, generator=gen) for n in (q_len, seq_len, seq_len))
    got = explicit.soft_capped_prefill(q, k, v, 0.35, 1.5, window)
    torch.testing.assert_close(got.double(), _reference(q, k, v, 0.35, 1.5, window), atol=1e-5, rtol=1e-5)
