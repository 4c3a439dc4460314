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

On CPU, without a window or a cap, each tile runs through torch's fused flash-attention CPU kernel
instead (``aten._scaled_dot_product_flash_attention_for_cpu``, which returns each row's
log-sum-exp, so tiles merge exactly): the cached prefix in tiles every query sees whole (the
query heads of a KV head folded into the query rows, so nothing is repeated), then the new tokens
with the plain causal mask. 1.5-4x faster than one masked SDPA call on 3-D inputs (torch's math
path) for a SmolLM2-shaped 512-token chunk over 2k-8k tokens, with memory bounded the same way.
"""

from __future__ import annotations

import torch

# Largest fp32 score tile (query rows x heads x keys x 4 bytes) one step holds; on the fused CPU
# path, the largest fp32-sized key / value tile (keys x KV heads x head size x 4 bytes).
DEFAULT_SCORE_BYTES = 32 << 20
_FUSED_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
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
    budget = score_bytes or DEFAULT_SCORE_BYTES
    if window is None and soft_cap is None and q.device.type == "cpu" and _FUSED_CPU is not None:
        return _fused_cpu_prefill(q, key_cache, value_cache, blocks, seq_len, scale, k_scale, v_scale, budget)
    rows, keys = tile_sizes(num_q, heads, seq_len, key_cache.shape[1], budget)
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


def _read_tile(cache: torch.Tensor, blocks: torch.Tensor, start: int, end: int, scale: float,
               dtype: torch.dtype) -> torch.Tensor:
    """[KH, end - start, D] in ``dtype`` (an FP8 cache times its scale)."""
    tile = _gather_tile(cache, blocks, start, end)
    if scale != 1.0:
        return (tile.float() * scale).to(dtype)
    return tile.to(dtype)


def _fused_cpu_prefill(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor,
                       seq_len: int, scale: float, k_scale: float, v_scale: float, budget: int) -> torch.Tensor:
    """paged_prefill_attention without window or cap on CPU: torch's fused kernel per tile, the
    tiles merged by their log-sum-exps."""
    num_q, heads, head_size = q.shape
    kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    group = heads // kv_heads
    prefix = seq_len - num_q
    keys = max(block_size, budget // (4 * kv_heads * head_size) // block_size * block_size)
    # [1, KH, group * Lq, D]: row g * Lq + j is query head h * group + g of token j.
    q_folded = q.view(num_q, kv_heads, group, head_size).permute(1, 2, 0, 3).reshape(1, kv_heads, -1, head_size)
    run_max = run_sum = acc = None

    def merge(out: torch.Tensor, lse: torch.Tensor) -> None:
        nonlocal run_max, run_sum, acc
        out, lse = out[0].float(), lse[0]  # [KH, group * Lq, D], [KH, group * Lq]
        if acc is None:
            run_max, run_sum, acc = lse, torch.ones_like(lse), out
            return
        new_max = torch.maximum(run_max, lse)
        old_w, new_w = torch.exp(run_max - new_max), torch.exp(lse - new_max)
        run_sum = run_sum * old_w + new_w
        acc = acc * old_w[..., None] + out * new_w[..., None]
        run_max = new_max

    for t0 in range(0, prefix, keys):  # the cached prefix: every query sees all of it
        t1 = min(prefix, t0 + keys)
        k = _read_tile(key_cache, blocks, t0, t1, k_scale, q.dtype)[None]
        v = _read_tile(value_cache, blocks, t0, t1, v_scale, q.dtype)[None]
        merge(*_FUSED_CPU(q_folded, k, v, 0.0, False, scale=scale))
    # The new tokens: plain causal (as many keys as queries), each KV head repeated per query head
    # (a chunk's worth).
    k = _read_tile(key_cache, blocks, prefix, seq_len, k_scale, q.dtype).repeat_interleave(group, dim=0)
    v = _read_tile(value_cache, blocks, prefix, seq_len, v_scale, q.dtype).repeat_interleave(group, dim=0)
    out, lse = _FUSED_CPU(q.transpose(0, 1)[None], k[None], v[None], 0.0, True, scale=scale)
    merge(out.reshape(1, kv_heads, group * num_q, head_size), lse.reshape(1, kv_heads, group * num_q))
    res = (acc / run_sum[..., None]).view(kv_heads, group, num_q, head_size)
    return res.permute(2, 0, 1, 3).reshape(num_q, heads, head_size).to(q.dtype)
