"""Logit transforms that look at token history: min_tokens masking and penalties."""

from __future__ import annotations

import torch


def apply_min_tokens(logits: torch.Tensor, rows: torch.Tensor | None,
                     token_ids: torch.Tensor | None) -> torch.Tensor:
    """Forbid stop/eos ids (given as flat (row, token) pairs) for rows under min_tokens."""
    if rows is None or token_ids is None:
        return logits
    logits[rows, token_ids] = float("-inf")
    return logits


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, L] ids padded with -1 -> [B, V] occurrence counts (float32)."""
    num_rows = token_ids.shape[0]
    counts = torch.zeros(num_rows, vocab_size + 1, dtype=torch.float32,
                         device=token_ids.device)
    # Padding (-1) lands in the extra last column, which is dropped.
    index = torch.where(token_ids < 0, vocab_size, token_ids)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, *, prompt_token_ids: torch.Tensor | None,
                    output_token_ids: torch.Tensor, presence_penalties: torch.Tensor,
                    frequency_penalties: torch.Tensor,
                    repetition_penalties: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties, in place on [B, V] float32 logits.

    Repetition (HF/CTRL style) touches every token seen in the prompt or the output:
    positive logits are divided by the penalty, negative ones multiplied. Frequency
    subtracts penalty x count and presence subtracts penalty once, on output tokens only.
    """
    vocab_size = logits.shape[1]
    output_counts = token_counts(output_token_ids, vocab_size)
    output_seen = output_counts > 0
    rep = repetition_penalties.unsqueeze(1)
    seen = output_seen
    if prompt_token_ids is not None:
        seen = seen | (token_counts(prompt_token_ids, vocab_size) > 0)
    # Rows with penalty 1 are unchanged by either branch, so no per-row mask is needed.
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    logits -= frequency_penalties.unsqueeze(1) * output_counts
    logits -= presence_penalties.unsqueeze(1) * output_seen
    return logits
