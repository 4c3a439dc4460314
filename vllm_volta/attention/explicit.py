"""Attention written out in PyTorch ops, for what SDPA and the fused kernels do not do:
attention-logit soft-capping (Gemma 2). TORCH_SDPA uses it for soft-capped layers; VOLTA_PAGED
uses it for their prefill (its decode kernel caps the scores itself). The score products are
matmuls, so they run on tensor cores on every GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Largest fp32 score block one prefill chunk holds (heads x queries x keys x 4 bytes).
_SCORE_BYTES = 1 << 28


def context_mask(q_len: int, seq_len: int, window: int | None, device: torch.device | str
                 ) -> torch.Tensor | None:
    """[q_len, seq_len] bool, True where query j (the token at position seq_len - q_len + j)
    sees key i: i <= its position and, with a window, i > position - window. None when that is
    the plain causal mask (nothing cached before the queries, no window)."""
    if q_len == seq_len and window is None:
        return None
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float, soft_cap: float | None = None) -> torch.Tensor:
    """softmax(cap(q k^T * scale) masked) v. q [..., H, Lq, D], k / v [..., H, Lk, D] (the query's
    dtype), ``mask`` broadcastable to [..., Lq, Lk] (True = attend), or None for the plain causal
    mask (Lq == Lk). Without a soft cap this is SDPA; with one the scores are capped in fp32."""
    if soft_cap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale / soft_cap).tanh_().mul_(soft_cap)
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril_()
    scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1).to(v.dtype), v)


def soft_capped_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, soft_cap: float,
                        window: int | None) -> torch.Tensor:
    """One sequence's new tokens q [Lq, H, D] (the last Lq of its Lk) over its context k / v
    [Lk, H, D] -> [Lq, H, D], in query chunks whose fp32 scores fit _SCORE_BYTES."""
    q_len, heads, _ = q.shape
    seq_len = k.shape[0]
    mask = context_mask(q_len, seq_len, window, q.device)
    if mask is None:
        mask = torch.ones(q_len, seq_len, dtype=torch.bool, device=q.device).tril_()  # chunked below
    kt, vt = k.transpose(0, 1), v.transpose(0, 1)
    chunk = max(1, _SCORE_BYTES // (4 * heads * seq_len))
    out = torch.empty_like(q)
    for s in range(0, q_len, chunk):
        e = min(q_len, s + chunk)
        res = masked_attention(q[s:e].transpose(0, 1), kt, vt, mask[s:e], scale, soft_cap)
        out[s:e] = res.transpose(0, 1)
    return out
