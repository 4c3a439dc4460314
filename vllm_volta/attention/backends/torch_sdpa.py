"""TORCH_SDPA: the universal attention backend, plain PyTorch on any device.

Keys/values are gathered from the paged cache through the block table and handed to
``torch.nn.functional.scaled_dot_product_attention``. Decode sequences (one new token each) run
as one padded batch (a sliding window narrows their mask; a logit soft cap runs the explicit math
of attention/explicit.py). Prefill sequences run one by one: a fresh prompt (nothing cached, no
window, no soft cap) as one causal SDPA call on 4-D inputs, which torch runs as its fused kernel
on CPU (3-D inputs take the math path, which holds [heads, q, q] scores); a chunk over a cached
prefix, a windowed or a soft-capped prefill (new tokens that are the LAST ``q_len`` of
``seq_len``) through attention/tiled_prefill.py, which reads the context from the cache tile by
tile with an online softmax: a 128k-token prompt's chunks need memory bounded by the chunk, not
by the context. That split is worked out by the first layer of a step
(per window) and cached on the AttentionMetadata, so a metadata object must not be changed in
place once a forward pass has used it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_volta.attention.backends import AttentionImplBase
from vllm_volta.attention.explicit import masked_attention
from vllm_volta.attention.kv_cache_dtype import read_cache
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.attention.tiled_prefill import paged_prefill_attention

if TYPE_CHECKING:
    from vllm_volta.platforms.interface import DeviceCapability

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class TorchSDPABackend:
    """Backend class: selection checks plus the impl class (contract in docs/ARCHITECTURE.md)."""

    name = "TORCH_SDPA"
    # The impl reads CPU-side lengths and loops in Python, so it cannot be captured in a graph.
    supports_cuda_graphs = False

    @staticmethod
    def validate(*, capability: DeviceCapability | None, dtype: torch.dtype, head_size: int,
                 device_type: str) -> list[str]:
        """Reasons this backend cannot run in the given setting (empty list = it can)."""
        reasons = []
        if dtype not in _SUPPORTED_DTYPES:
            reasons.append(f"dtype {dtype} is not one of float16, bfloat16, float32")
        if (dtype == torch.bfloat16 and device_type == "cuda" and capability is not None
                and capability.major < 8):
            reasons.append(f"bfloat16 needs compute capability >= 8.0, "
                           f"got {capability.major}.{capability.minor}")
        return reasons

    @staticmethod
    def get_impl_cls() -> type[TorchSDPAImpl]:
        return TorchSDPAImpl


@dataclass
class _Plan:
    """Per-step work split, built once per metadata and shared by every layer."""

    decode_tokens: torch.Tensor | None = None  # [Bd] token index of each decode sequence
    decode_slots: torch.Tensor | None = None  # [Bd * L] cache slot of each context position
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, L] True = context position is valid
    decode_all_valid: bool = False  # no padding and no window: the mask is all True
    decode_len: int = 0
    decode_contiguous: bool = False  # decode rows are tokens 0..Bd-1 (no index / scatter)
    # (start token, q_len, seq_len, blocks [nb])
    prefills: list[tuple[int, int, int, torch.Tensor]] = field(default_factory=list)


def _build_plan(md: AttentionMetadata, block_size: int, window: int | None) -> _Plan:
    plan = _Plan()
    starts = md.query_start_loc_cpu.tolist()
    seq_lens = md.seq_lens_cpu.tolist()
    decodes = [i for i in range(len(seq_lens)) if starts[i + 1] - starts[i] == 1]
    if decodes:
        _plan_decodes(plan, md, decodes, [starts[i] for i in decodes], [seq_lens[i] for i in decodes],
                      block_size, window)
    for i, seq_len in enumerate(seq_lens):
        q_len = starts[i + 1] - starts[i]
        if q_len <= 1:
            continue
        blocks = md.block_table[i, : -(-seq_len // block_size)].long()
        plan.prefills.append((starts[i], q_len, seq_len, blocks))
    return plan


def _plan_decodes(plan: _Plan, md: AttentionMetadata, rows: list[int], tokens: list[int],
                  lens_list: list[int], block_size: int, window: int | None) -> None:
    """The decode rows' flat cache slots and mask, once per step for every layer: each layer then
    reads its context with one index_select per cache half (no per-layer block arithmetic)."""
    device = md.block_table.device
    lens = torch.tensor(lens_list)
    plan.decode_len = length = max(lens_list)
    plan.decode_tokens = torch.tensor(tokens, device=device)
    plan.decode_contiguous = tokens == list(range(len(tokens)))
    blocks = md.block_table[torch.tensor(rows, device=device), :-(-length // block_size)].long()
    slots = (blocks[:, :, None] * block_size + torch.arange(block_size, device=device)).flatten(1)
    pos = torch.arange(length)[None, :]
    mask = pos < lens[:, None]
    if window is not None:
        mask &= pos >= lens[:, None] - window
    # Padded positions read whatever the table's padding (block 0) holds: the mask hides them.
    plan.decode_slots = slots[:, :length].reshape(-1)
    plan.decode_mask = mask[:, None, None, :].to(device)
    plan.decode_all_valid = bool(mask.all())


class TorchSDPAImpl(AttentionImplBase):
    """Attention over the paged cache with torch's scaled_dot_product_attention."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """query [T, H*D] -> [T, H*D]; the new key/value are already in ``kv_cache``."""
        del key, value  # read back from the cache, which now holds the whole context
        md = attn_metadata
        window = self.sliding_window
        plan = md.step_cached(f"torch_sdpa/{window}", lambda: _build_plan(md, kv_cache.shape[2], window))
        num_tokens = md.num_actual_tokens
        q = query[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        output = torch.zeros_like(query)
        out = output[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        if plan.decode_tokens is not None:  # all one-token sequences as one padded batch
            self._decode(q, out, key_cache, value_cache, plan)
        for start, q_len, seq_len, blocks in plan.prefills:
            if q_len != seq_len or window is not None or self.logits_soft_cap is not None:
                out[start:start + q_len] = paged_prefill_attention(
                    q[start:start + q_len], key_cache, value_cache, blocks, seq_len, self.scale,
                    window=window, soft_cap=self.logits_soft_cap, k_scale=self.k_scale,
                    v_scale=self.v_scale).to(out.dtype)
                continue
            k = self._gather_kv(key_cache, blocks, seq_len, self.k_scale, q.dtype)  # [H, L, D]
            v = self._gather_kv(value_cache, blocks, seq_len, self.v_scale, q.dtype)
            qs = q[start:start + q_len].transpose(0, 1)  # [H, q_len, D]
            # 4-D: torch's fused CPU kernel, not the math path (plain causal: no mask).
            res = self._sdpa(qs.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None).squeeze(0)
            out[start:start + q_len] = res.transpose(0, 1).to(out.dtype)
        return output

    def _decode(self, q: torch.Tensor, out: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor, plan: _Plan) -> None:
        """The decode rows: their contexts read by flat slot into [B, L, KH, D] and attended as
        [B, KH, L, D] by the query heads grouped per kv head ([B, KH, G, D]), so grouped-query
        attention shares each kv head instead of repeating it G times."""
        n, length = plan.decode_tokens.shape[0], plan.decode_len
        kh, d, g = key_cache.shape[-2], key_cache.shape[-1], self.num_queries_per_kv
        k = read_cache(key_cache.view(-1, kh, d).index_select(0, plan.decode_slots), self.k_scale, q.dtype)
        v = read_cache(value_cache.view(-1, kh, d).index_select(0, plan.decode_slots), self.v_scale, q.dtype)
        k = k.view(n, length, kh, d).transpose(1, 2)
        v = v.view(n, length, kh, d).transpose(1, 2)
        qb = q[:n] if plan.decode_contiguous else q[plan.decode_tokens]
        qb = qb.view(n, kh, g, d)  # the group sits where SDPA expects query positions
        if plan.decode_all_valid and self.logits_soft_cap is None:  # unmasked: SDPA's fast path
            res = F.scaled_dot_product_attention(qb, k, v, scale=self.scale)
        else:
            res = self._sdpa(qb, k, v, plan.decode_mask)  # [B, KH, G, D]
        res = res.reshape(n, kh * g, d)
        if plan.decode_contiguous:
            out[:n] = res
        else:
            out[plan.decode_tokens] = res.to(out.dtype)

    def _gather_kv(self, cache: torch.Tensor, blocks: torch.Tensor, length: int, scale: float,
                   dtype: torch.dtype) -> torch.Tensor:
        """Context of ``length`` tokens from ``blocks`` ([..., nb]) -> [..., H, length, D] in
        ``dtype`` (an FP8 cache dequantized with ``scale``)."""
        gathered = cache[blocks]  # [..., nb, block_size, KH, D]
        gathered = gathered.flatten(-4, -3)[..., :length, :, :]  # [..., length, KH, D]
        gathered = read_cache(gathered, scale, dtype)
        gathered = gathered.transpose(-3, -2)
        if self.num_queries_per_kv > 1:  # GQA: each kv head serves a group of query heads
            gathered = gathered.repeat_interleave(self.num_queries_per_kv, dim=-3)
        return gathered

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
        # SDPA wants matching dtypes (_gather_kv read the cache as the query's).
        return masked_attention(q, k, v, mask, self.scale, self.logits_soft_cap)
