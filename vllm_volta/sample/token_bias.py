"""Logit transforms a request sets per token id: allowed_token_ids (vLLM) and logit_bias (OpenAI)."""

from __future__ import annotations

import torch


def apply_allowed_token_ids(logits: torch.Tensor, rows: torch.Tensor | None,
                            pairs: torch.Tensor | None) -> torch.Tensor:
    """-inf for every id outside each restricted row's allowed ids, in place on [B, V] logits.
    ``rows`` [R]: the restricted rows; ``pairs`` [2, M]: (index into ``rows``, allowed id)."""
    if rows is None or pairs is None:
        return logits
    blocked = torch.ones(rows.shape[0], logits.shape[1], dtype=torch.bool, device=logits.device)
    blocked[pairs[0], pairs[1]] = False
    logits[rows] = logits[rows].masked_fill_(blocked, float("-inf"))
    return logits


def apply_logit_bias(logits: torch.Tensor, bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
                     ) -> torch.Tensor:
    """logits[row, id] += value for each (row, id, value) of ``bias``, in place."""
    if bias is None:
        return logits
    rows, ids, values = bias
    logits.index_put_((rows, ids), values.to(logits.dtype), accumulate=True)
    return logits
