"""Truncation filters on temperature-scaled logits: top-k, top-p (nucleus) and min-p.

Semantics are those of transformers' TopKLogitsWarper / TopPLogitsWarper /
MinPLogitsWarper applied in that order (vLLM's as well): top-k keeps ties at the k-th
value, top-p drops the low tail whose mass is <= 1 - p and always keeps the top token,
min-p drops tokens whose probability is below min_p x the top probability.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def _top_k_threshold_sorted_asc(sorted_logits: torch.Tensor,
                                top_k: torch.Tensor) -> torch.Tensor:
    """The k-th largest value per row of ascending-sorted logits (-inf where k is 0/off)."""
    vocab_size = sorted_logits.shape[1]
    k = top_k.clamp(max=vocab_size)
    position = (vocab_size - k).clamp(max=vocab_size - 1).unsqueeze(1)
    threshold = sorted_logits.gather(1, position)
    return threshold.masked_fill((k <= 0).unsqueeze(1), _NEG_INF)


def apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Top-k without a full sort: torch.topk up to the batch's largest k."""
    vocab_size = logits.shape[1]
    k_max = min(max_top_k, vocab_size)
    top_values = logits.topk(k_max, dim=1).values  # descending
    k = top_k.clamp(max=k_max)
    threshold = top_values.gather(1, (k - 1).clamp(min=0).unsqueeze(1))
    threshold = threshold.masked_fill((k <= 0).unsqueeze(1), _NEG_INF)
    return logits.masked_fill_(logits < threshold, _NEG_INF)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, max_top_k: int,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p on [B, V] logits (either may be None = off for every row)."""
    if top_p is None:
        if top_k is None:
            return logits
        return apply_top_k_only(logits, top_k, max_top_k)
    sorted_logits, order = logits.sort(dim=1, descending=False)
    if top_k is not None:
        threshold = _top_k_threshold_sorted_asc(sorted_logits, top_k)
        sorted_logits.masked_fill_(sorted_logits < threshold, _NEG_INF)
    # Softmax after the top-k mask: top-p sees the renormalized top-k distribution.
    cumulative = sorted_logits.softmax(dim=1).cumsum(dim=1)
    drop = cumulative <= (1.0 - top_p).unsqueeze(1)
    drop[:, -1] = False  # always keep the most likely token
    sorted_logits.masked_fill_(drop, _NEG_INF)
    return logits.scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the row's top probability."""
    probs = logits.softmax(dim=1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=1, keepdim=True)
    return logits.masked_fill_(probs < threshold, _NEG_INF)
