"""Prefill attention over a paged context in tiles, with an online softmax: memory bounded by a
score budget, whatever the context length.

A prompt chunk of Lq new tokens (the last Lq of a sequence's seq_len) attends to its whole
context. Written as one SDPA call with a [Lq, seq_len] mask, that builds the mask and, on CPU
(where SDPA on 3-D inputs takes the math path), [H, Lq, seq_len] scores: at a 128k context a
512-token chunk of a 32-head model holds 8 GiB of fp32 scores. Here the context is read from the
cache tile by tile (keys/values gathered per tile, never the whole context, and never repeated
per query head: the query heads of one KV head share its tile) and combined with a running
max / sum per query row (the online softmax of FlashAttention). Queries are split into chunks
too, so a long prompt prefilled in one step stays within the budget as well; key tiles past a
query chunk's last position, or before its window, are skipped.

Scores and accumulators are fp32 (the output is cast back to the query's dtype); a logit soft cap
(Gemma 2) is applied to each tile's scores, so the capped path needs no separate code.
"""

from __future__ import annotations

import torch

# Largest fp32 score tile (query rows x heads x keys x 4 bytes) one step holds.
DEFAULT_SCORE_BYTES = 32 << 20
_MAX_TILE_KEYS = 4096  # longer tiles save little per-tile overhead and cost more memory


def _gather_tile(cache: torch.Tensor, blocks: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Keys (or values) of context positions [start, end) from the paged ``cache``
    [num_blocks, block_size, KH, D] -> [KH, end - start, D]."""
    block_size = cache.shape[1]
    first, last = start // block_size, -(-end // block_size)
    tile = cache[blocks[first:last]].flatten(0, 1)  # [(last - first) * block_size, KH, D]
    offset = start - first * block_size
    return tile[offset:offset + end - start].transpose(0, 1)


def tile_sizes(num_queries: int, num_heads: int, seq_len: int, block_size: int,
               score_bytes: int) -> tuple[int, int]:
    """(query rows per chunk, keys per tile) whose fp32 scores fit ``score_bytes``: tiles of whole
    cache blocks, as long as the budget allows with every query in one chunk (up to 4096 keys),
    the queries split only when even one block per tile would not fit."""
    keys = max(block_size, min(_MAX_TILE_KEYS, seq_len, score_bytes // (4 * num_heads * max(num_queries, 1))))
    keys = max(block_size, keys // block_size * block_size)
    rows = max(1, min(num_queries, score_bytes // (4 * num_heads * keys)))
    return rows, keys


def paged_prefill_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            blocks: torch.Tensor, seq_len: int, scale: float, *, window: int | None = None,
                            soft_cap: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                            score_bytes: int | None = None) -> torch.Tensor:
    """Attention of one sequence's new tokens ``q`` [Lq, H, D] (positions seq_len - Lq ...
    seq_len - 1) over its context in the paged caches [num_blocks, block_size, KH, D] through
    ``blocks`` (its block-table row) -> [Lq, H, D] in q's dtype. Query j sees key i when
    i <= its position and, with ``window``, i > position - window. An FP8 cache is read as its
    values times ``k_scale`` / ``v_scale`` (any cache is read in fp32). ``score_bytes``: the
    score-tile budget (default DEFAULT_SCORE_BYTES)."""
    num_q, heads, head_size = q.shape
    kv_heads = key_cache.shape[2]
    group = heads // kv_heads
    if num_q == 0:
        return torch.empty_like(q)
    rows, keys = tile_sizes(num_q, heads, seq_len, key_cache.shape[1], score_bytes or DEFAULT_SCORE_BYTES)
    out = torch.empty_like(q)
    first_pos = seq_len - num_q
    # [KH, group, Lq, D]: the query heads of KV head h are h * group ... (h + 1) * group - 1.
    q_grouped = q.view(num_q, kv_heads, group, head_size).permute(1, 2, 0, 3).float()
    for q0 in range(0, num_q, rows):
        q1 = min(num_q, q0 + rows)
        lo_pos, hi_pos = first_pos + q0, first_pos + q1 - 1  # positions of the chunk's queries
        qc = q_grouped[:, :, q0:q1].reshape(kv_heads, group * (q1 - q0), head_size)
        n = qc.shape[1]
        run_max = torch.full((kv_heads, n), float("-inf"), device=q.device)
        run_sum = torch.zeros(kv_heads, n, device=q.device)
        acc = torch.zeros(kv_heads, n, head_size, device=q.device)
        k_start = 0 if window is None else max(0, lo_pos - window + 1)
        k_start -= k_start % keys  # tiles aligned to multiples of `keys`
        q_pos = torch.arange(lo_pos, hi_pos + 1, device=q.device)[:, None]
        for t0 in range(k_start, hi_pos + 1, keys):
            t1 = min(t0 + keys, hi_pos + 1)
            k = _gather_tile(key_cache, blocks, t0, t1).float()
            v = _gather_tile(value_cache, blocks, t0, t1).float()
            if k_scale != 1.0:
                k = k.mul_(k_scale)
            if v_scale != 1.0:
                v = v.mul_(v_scale)
            scores = torch.matmul(qc, k.transpose(1, 2)).mul_(scale)  # [KH, group * rows, T]
            if soft_cap is not None:
                scores = scores.div_(soft_cap).tanh_().mul_(soft_cap)
            # A mask only where some query of the chunk cannot see some key of the tile.
            if t1 - 1 > lo_pos or (window is not None and t0 <= hi_pos - window):
                k_pos = torch.arange(t0, t1, device=q.device)[None, :]
                visible = k_pos <= q_pos
                if window is not None:
                    visible &= k_pos > q_pos - window
                scores = scores.view(kv_heads, group, q1 - q0, t1 - t0).masked_fill_(
                    ~visible, float("-inf")).view(kv_heads, n, t1 - t0)
            new_max = torch.maximum(run_max, scores.amax(-1))
            # Rows that have seen no visible key yet keep a max of -inf: shift by 0 there.
            shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            probs = torch.exp(scores - shift[..., None])
            rescale = torch.exp(run_max - shift)
            run_sum = run_sum * rescale + probs.sum(-1)
            acc = acc * rescale[..., None] + torch.matmul(probs, v)
            run_max = new_max
        res = (acc / run_sum[..., None]).view(kv_heads, group, q1 - q0, head_size)
        out[q0:q1] = res.permute(2, 0, 1, 3).reshape(q1 - q0, heads, head_size).to(q.dtype)
    return out
