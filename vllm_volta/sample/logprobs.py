"""Logprob tensors (sampled token + top-k with ranks) and their conversion to Logprob dicts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vllm_volta.outputs import Logprob


@dataclass
class LogprobsTensors:
    """Per-row logprobs: column 0 is the chosen token, columns 1..k the top-k tokens."""

    logprob_token_ids: torch.Tensor  # [N, k+1] int64
    logprobs: torch.Tensor           # [N, k+1] float32
    selected_token_ranks: torch.Tensor  # [N] int64, 1-based rank of the chosen token

    def tolists(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Copy to Python lists (one device sync for the three tensors)."""
        return (self.logprob_token_ids.tolist(), self.logprobs.tolist(),
                self.selected_token_ranks.tolist())


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor,
                    num_logprobs: int) -> LogprobsTensors:
    """Logprob and rank of `token_ids` plus the top `num_logprobs` of each row.

    rank = 1 + number of tokens with a strictly larger logprob (vLLM's definition).
    """
    token_ids = token_ids.to(torch.int64).unsqueeze(1)
    token_logprobs = logprobs.gather(1, token_ids)
    ranks = (logprobs > token_logprobs).sum(dim=1) + 1
    if num_logprobs > 0:
        top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=1)
        token_ids = torch.cat([token_ids, top_ids], dim=1)
        token_logprobs = torch.cat([token_logprobs, top_logprobs], dim=1)
    return LogprobsTensors(token_ids, token_logprobs, ranks)


def compute_prompt_logprobs(logits: torch.Tensor, next_token_ids: torch.Tensor,
                            num_logprobs: int) -> LogprobsTensors:
    """Prompt logprobs: logits[j] is the model's prediction at prompt position j and
    next_token_ids[j] the prompt token at j + 1 (raw log-softmax, no sampling transforms)."""
    return gather_logprobs(logits.float().log_softmax(dim=1), next_token_ids, num_logprobs)


def make_logprobs_dict(token_ids: Sequence[int], logprobs: Sequence[float], rank: int,
                       num_logprobs: int,
                       decode: Callable[[int], str] | None = None) -> dict[int, Logprob]:
    """One row of LogprobsTensors -> {token_id: Logprob}, chosen token first.

    Only the first `num_logprobs` top entries are kept (rows in a batch may ask for fewer
    than the batch maximum); top entries get ranks 1..k.
    """
    entries = [(token_ids[0], logprobs[0], rank)]
    entries += [(token_ids[1 + j], logprobs[1 + j], 1 + j) for j in range(num_logprobs)]
    result: dict[int, Logprob] = {}
    for tid, lp, r in entries:
        if tid not in result:  # the chosen token keeps its own rank when also in the top-k
            result[tid] = Logprob(lp, r, decode(tid) if decode is not None else None)
    return result


def token_decoder(tokenizer) -> Callable[[int], str]:
    """decoded_token for Logprob: each id decoded on its own, special tokens kept."""
    def decode(token_id: int) -> str:
        return tokenizer.decode([token_id])
    return decode
