"""top-k / top-p / min-p vs transformers' TopK/TopP/MinP warpers, row by row."""

from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from vllm_volta.sample.filters import apply_min_p, apply_top_k_top_p

VOCAB = 50


def _logits(rows: int, seed: int = 0, tie: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=g) * 2
    if tie:
        logits[0, :4] = logits[0].max() + 1.0  # a 4-way tie at the top
    return logits


def _hf_reference(logits: torch.Tensor, ks: list[int], ps: list[float]) -> torch.Tensor:
    rows = []
    for i, (k, p) in enumerate(zip(ks, ps)):
        row = logits[i:i + 1].clone()
        if k > 0:
            row = TopKLogitsWarper(k)(None, row)
        if p < 1.0:
            row = TopPLogitsWarper(p)(None, row)
        rows.append(row)
    return torch.cat(rows)


@pytest.mark.parametrize("ks, ps", [
    ([2, 1, 0, 7, VOCAB + 5], [1.0] * 5),        # top-k only (topk path)
    ([0, 0, 0, 0, 0], [0.3, 0.9, 1.0, 0.05, 0.6]),  # top-p only (sort path)
    ([3, 0, 10, 1, 5], [0.5, 0.7, 1.0, 0.9, 0.95]),  # both
])
def test_top_k_top_p_match_transformers(ks, ps) -> None:
    # Ties only where top-p cannot split them (which tied token a nucleus keeps is arbitrary).
    logits = _logits(len(ks), tie=all(p == 1.0 for p in ps))
    top_k = torch.tensor(ks) if any(ks) else None
    top_p = torch.tensor(ps) if any(p < 1 for p in ps) else None
    got = apply_top_k_top_p(logits.clone(), top_k, max(ks), top_p)
    expected = _hf_reference(logits, ks, ps)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got[~torch.isinf(got)], logits[~torch.isinf(expected)])


def test_top_k_keeps_ties() -> None:
    logits = _logits(1, tie=True)
    got = apply_top_k_top_p(logits.clone(), torch.tensor([2]), 2, None)
    assert int(torch.isfinite(got).sum()) == 4  # all four tied top tokens survive top-2


def test_no_filters_is_identity() -> None:
    logits = _logits(2)
    assert torch.equal(apply_top_k_top_p(logits.clone(), None, 0, None), logits)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_matches_transformers(min_p: float) -> None:
    logits = _logits(3, seed=1)
    got = apply_min_p(logits.clone(), torch.full((3,), min_p))
    if min_p == 0.0:
        assert torch.equal(got, logits)
        return
    expected = MinPLogitsWarper(min_p)(None, logits.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.isfinite(got).any(dim=1).all()
