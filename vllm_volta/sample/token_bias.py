"""Logit transforms a request sets per token id: allowed_token_ids (vLLM), logit_bias (OpenAI)
and the token bitmasks of structured outputs (structured_output.py)."""

from __future__ import annotations

import torch


def keep_only(logits: torch.Tensor, rows: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """-inf, in place on [B, V] logits, wherever ``allowed`` [len(rows), V] (bool) is False in
    ``rows``: the tokens those rows may not take (allowed_token_ids, structured outputs)."""
    logits[rows] = logits[rows].masked_fill_(~allowed, float("-inf"))
    return logits


def apply_allowed_token_ids(logits: torch.Tensor, rows: torch.Tensor | None,
                            pairs: torch.Tensor | None) -> torch.Tensor:
    """-inf for every id outside each restricted row's allowed ids, in place on [B, V] logits.
    ``rows`` [R]: the restricted rows; ``pairs`` [2, M]: (index into ``rows``, allowed id)."""
    if rows is None or pairs is None:
        return logits
    allowed = torch.zeros(rows.shape[0], logits.shape[1], dtype=torch.bool, device=logits.device)
    allowed[pairs[0], pairs[1]] = True
    return keep_only(logits, rows, allowed)


def apply_logit_bias(logits: torch.Tensor, bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
                     ) -> torch.Tensor:
    """logits[row, id] += value for each (row, id, value) of ``bias``, in place."""
    if bias is None:
        return logits
    rows, ids, values = bias
    logits.index_put_((rows, ids), values.to(logits.dtype), accumulate=True)
    return logits


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """-inf, in place, for the tokens each of ``rows`` may not take (``bitmask`` from
    structured_output.fill_bitmask, on any device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :logits.shape[1]]
    if allowed.shape[1] < logits.shape[1]:  # the logits' rows are wider than the grammar's vocabulary
        allowed = torch.nn.functional.pad(allowed, (0, logits.shape[1] - allowed.shape[1]))
    return keep_only(logits, rows, allowed)
