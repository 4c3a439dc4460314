"""Logprob helpers: gathering with ranks, prompt logprobs, conversion to Logprob dicts."""

from __future__ import annotations

import torch

from vllm_volta.outputs import Logprob
from vllm_volta.sample.logprobs import (compute_prompt_logprobs, gather_logprobs,
                                        make_logprobs_dict, token_decoder)


def test_prompt_logprobs_score_next_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 30, dtype=torch.float16)
    next_ids = torch.tensor([3, 0, 29, 7, 7])
    lt = compute_prompt_logprobs(logits, next_ids, num_logprobs=2)
    ref = logits.float().log_softmax(dim=1)
    torch.testing.assert_close(lt.logprobs[:, 0], ref[torch.arange(5), next_ids])
    assert torch.equal(lt.logprob_token_ids[:, 0], next_ids)
    ranks = [(ref[i] > ref[i, next_ids[i]]).sum().item() + 1 for i in range(5)]
    assert lt.selected_token_ranks.tolist() == ranks
    assert torch.equal(lt.logprob_token_ids[:, 1:], ref.topk(2, dim=1).indices)


def test_gather_without_top_k() -> None:
    lp = torch.tensor([[-0.1, -3.0, -2.0]]).log_softmax(dim=1)
    lt = gather_logprobs(lp, torch.tensor([2]), 0)
    assert lt.logprob_token_ids.tolist() == [[2]] and lt.selected_token_ranks.tolist() == [2]


def test_make_logprobs_dict_orders_dedupes_and_slices() -> None:
    ids, lps, rank = [7, 7, 2, 9], [-0.5, -0.5, -1.0, -2.0], 1
    d = make_logprobs_dict(ids, lps, rank, num_logprobs=2, decode=lambda t: f"<{t}>")
    assert list(d) == [7, 2]
    assert d[7] == Logprob(-0.5, 1, "<7>") and d[2] == Logprob(-1.0, 2, "<2>")
    sampled_outside = make_logprobs_dict([4, 7, 2], [-3.0, -0.5, -1.0], 5, num_logprobs=1)
    assert sampled_outside == {4: Logprob(-3.0, 5, None), 7: Logprob(-0.5, 1, None)}


def test_token_decoder_uses_tokenizer_decode() -> None:
    class Tok:
        def decode(self, ids):
            return "|".join(map(str, ids))
    assert token_decoder(Tok())(12) == "12"
