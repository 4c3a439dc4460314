"""Penalties and min_tokens masking vs transformers' processor and a plain-torch reference."""

from __future__ import annotations

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from vllm_volta.sample.penalties import apply_min_tokens, apply_penalties, token_counts


def _padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows])


def test_token_counts_ignores_padding() -> None:
    counts = token_counts(_padded([[1, 1, 3], [0]]), vocab_size=4)
    assert counts.tolist() == [[0, 2, 0, 1], [1, 0, 0, 0]]


def test_penalties_match_references() -> None:
    torch.manual_seed(0)
    vocab = 12
    logits = torch.randn(3, vocab) * 3
    prompts = [[0, 1, 2, 2], [5], [7, 8]]
    outputs = [[2, 3, 3, 3], [5, 6, 5], []]
    rep = torch.tensor([1.3, 0.7, 2.0])
    pres = torch.tensor([0.5, -0.4, 1.0])
    freq = torch.tensor([0.25, 1.5, -2.0])
    got = apply_penalties(logits.clone(), prompt_token_ids=_padded(prompts),
                          output_token_ids=_padded(outputs), presence_penalties=pres,
                          frequency_penalties=freq, repetition_penalties=rep)
    for i in range(3):
        # HF's repetition processor sees prompt + output as its input_ids.
        ids = torch.tensor([prompts[i] + outputs[i]])
        expected = RepetitionPenaltyLogitsProcessor(float(rep[i]))(ids, logits[i:i + 1].clone())[0]
        for tok in set(outputs[i]):
            n = outputs[i].count(tok)
            expected[tok] -= float(freq[i]) * n + float(pres[i])
        torch.testing.assert_close(got[i], expected)


def test_neutral_penalties_leave_logits_unchanged() -> None:
    logits = torch.randn(2, 6)
    got = apply_penalties(logits.clone(), prompt_token_ids=_padded([[1], [2]]),
                          output_token_ids=_padded([[3, 3], [4]]),
                          presence_penalties=torch.zeros(2), frequency_penalties=torch.zeros(2),
                          repetition_penalties=torch.ones(2))
    torch.testing.assert_close(got, logits)


def test_min_tokens_masks_given_pairs() -> None:
    logits = torch.zeros(2, 5)
    apply_min_tokens(logits, torch.tensor([0, 0, 1]), torch.tensor([1, 4, 2]))
    expected = torch.zeros(2, 5)
    expected[0, 1] = expected[0, 4] = expected[1, 2] = float("-inf")
    assert torch.equal(logits, expected)
    assert apply_min_tokens(logits, None, None) is logits
