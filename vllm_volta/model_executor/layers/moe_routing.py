"""Mixture-of-experts routing and expert ordering, on the device without a host round trip.

``select_experts`` turns router logits [T, E] into each token's ``top_k`` experts (int32 ids,
float32 weights, largest first; renormalized to sum to 1 when asked): the ``topk_softmax`` /
``topk_sigmoid`` CUDA ops where they exist, the same math in PyTorch elsewhere.

``align_block_size`` is the expert ordering of the grouped GEMM (vLLM's ``moe_align_block_size``):
the T k (token, expert) pairs, numbered p = t k + j, listed expert by expert, each expert's run
padded with the id T k (past every pair) to a multiple of ``block_size``; one expert id per
block (-1 past the padded length) and the padded length. The buffers have the worst-case size,
T k + E (block_size - 1), so their shapes depend only on T (CUDA-graph capturable). The PyTorch
version (CPU, and the tests' reference) computes the same thing from tensors alone, in pair order
within an expert; the CUDA kernel's order within an expert may differ.
"""

from __future__ import annotations

import torch

from vllm_volta import _custom_ops as ops

SCORING_FUNCS = ("softmax", "sigmoid")


def _check_scoring(scoring: str) -> None:
    if scoring not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring!r}")


def topk_reference(logits: torch.Tensor, top_k: int, scoring: str = "softmax"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], ids int32 [T, k]) in PyTorch: float32 scores, then top-k."""
    _check_scoring(scoring)
    x = logits.float()
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    weights, ids = scores.topk(top_k, dim=-1)
    return weights, ids.to(torch.int32)


def select_experts(logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str = "softmax"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts: (weights float32 [T, k], ids int32 [T, k]), no host sync."""
    _check_scoring(scoring)
    op = f"topk_{scoring}"
    if logits.is_cuda and ops.has_cuda_kernel(op) and logits.shape[-1] <= 1024 and top_k <= 32:
        t = logits.shape[0]
        weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
        ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
        token_expert = torch.empty_like(ids)
        getattr(ops, op)(weights, ids, token_expert, logits.contiguous())
    else:
        weights, ids = topk_reference(logits, top_k, scoring)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


def max_padded_pairs(pairs: int, num_experts: int, block_size: int) -> int:
    """Length of ``sorted_token_ids``: every expert may need block_size - 1 rows of padding."""
    return pairs + num_experts * (block_size - 1)


def align_reference(topk_ids: torch.Tensor, num_experts: int, block_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``align_block_size`` in PyTorch ops (no host sync): pairs in pair order within an expert;
    ids outside [0, num_experts) (-1: an expert on another rank) are left out, as the kernel does."""
    ids = topk_ids.flatten().long()
    pairs, device = ids.numel(), ids.device
    length = max_padded_pairs(pairs, num_experts, block_size)
    blocks = -(-length // block_size)
    # Left-out pairs go to an extra bucket past the last expert: sorted after every real run.
    ids = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    bucket_counts = torch.bincount(ids, minlength=num_experts + 1)
    counts = bucket_counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    # The extra bucket's pairs are written past `length`, into room cut off below.
    starts = torch.cat([ends - padded, ends.new_full((1,), length)])
    order = torch.argsort(ids, stable=True)
    sorted_experts = ids[order]
    first_in_run = bucket_counts.cumsum(0) - bucket_counts  # where each bucket starts in `order`
    rank = torch.arange(pairs, device=device) - first_in_run[sorted_experts]
    sorted_ids = torch.full((length + pairs,), pairs, dtype=torch.int32, device=device)
    sorted_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    sorted_ids = sorted_ids[:length]
    total = ends[-1:].to(torch.int32)
    block_starts = torch.arange(blocks, device=device) * block_size
    experts_ids = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    experts_ids[block_starts >= total.long()] = -1
    return sorted_ids, experts_ids, total


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids int32, experts_ids int32, num_tokens_post_pad int32 [1]) of ``topk_ids``."""
    if not 1 <= block_size <= 256:
        raise ValueError(f"block_size must be in [1, 256], got {block_size}")
    if topk_ids.is_cuda and ops.has_cuda_kernel("moe_align_block_size") and num_experts <= 1024:
        length = max_padded_pairs(topk_ids.numel(), num_experts, block_size)
        sorted_ids = torch.empty(length, dtype=torch.int32, device=topk_ids.device)
        experts_ids = torch.empty(-(-length // block_size), dtype=torch.int32, device=topk_ids.device)
        total = torch.empty(1, dtype=torch.int32, device=topk_ids.device)
        ops.moe_align_block_size(topk_ids.to(torch.int32).contiguous(), num_experts, block_size, sorted_ids,
                                 experts_ids, total)
        return sorted_ids, experts_ids, total
    return align_reference(topk_ids, num_experts, block_size)
