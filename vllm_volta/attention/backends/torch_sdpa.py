"""TORCH_SDPA: the universal attention backend, plain PyTorch on any device.

Keys/values are gathered from the paged cache through the block table and handed to
``torch.nn.functional.scaled_dot_product_attention``. Decode sequences (one new token each) run
as one padded batch; prefill (and chunked-prefill) sequences run one by one with a causal mask
shifted to their context offset, since their new tokens are the LAST ``q_len`` of ``seq_len``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_volta.attention.metadata import AttentionMetadata

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


class TorchSDPAImpl:
    """Attention over the paged cache with torch's scaled_dot_product_attention."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.num_queries_per_kv = num_heads // num_kv_heads

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """query [T, H*D] -> [T, H*D]; the new key/value are already in ``kv_cache``."""
        del key, value  # read back from the cache, which now holds the whole context
        md = attn_metadata
        num_tokens = md.num_actual_tokens
        q = query[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        output = torch.zeros_like(query)
        out = output[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        key_cache, value_cache = kv_cache[0], kv_cache[1]

        starts = md.query_start_loc_cpu.tolist()
        seq_lens = md.seq_lens_cpu.tolist()
        decode_seqs = [i for i in range(len(seq_lens)) if starts[i + 1] - starts[i] == 1]
        if decode_seqs:
            self._decode(q, out, key_cache, value_cache, md, decode_seqs, starts, seq_lens)
        for i in range(len(seq_lens)):
            q_len = starts[i + 1] - starts[i]
            if q_len > 1:
                self._prefill(q, out, key_cache, value_cache, md, i, starts[i], q_len, seq_lens[i])
        return output

    def _gather_kv(self, cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
        """Context of ``length`` tokens from ``blocks`` ([..., nb]) -> [..., KH, length, D]."""
        gathered = cache[blocks]  # [..., nb, block_size, KH, D]
        gathered = gathered.flatten(-4, -3)[..., :length, :, :]  # [..., length, KH, D]
        gathered = gathered.transpose(-3, -2)
        if self.num_queries_per_kv > 1:  # GQA: each kv head serves a group of query heads
            gathered = gathered.repeat_interleave(self.num_queries_per_kv, dim=-3)
        return gathered

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        # SDPA wants matching dtypes; the cache dtype is the model's activation dtype.
        return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                              is_causal=is_causal, scale=self.scale)

    def _decode(self, q: torch.Tensor, out: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor, md: AttentionMetadata, seqs: list[int],
                starts: list[int], seq_lens: list[int]) -> None:
        """All one-token sequences as one batch, padded to the longest context."""
        block_size = key_cache.shape[1]
        max_len = max(seq_lens[i] for i in seqs)
        num_blocks = -(-max_len // block_size)
        device = q.device
        seq_idx = torch.tensor(seqs, device=device)
        tok_idx = torch.tensor([starts[i] for i in seqs], device=device)
        lens = torch.tensor([seq_lens[i] for i in seqs], device=device)
        blocks = md.block_table[seq_idx, :num_blocks].long()
        k = self._gather_kv(key_cache, blocks, max_len)  # [B, H, L, D]
        v = self._gather_kv(value_cache, blocks, max_len)
        mask = torch.arange(max_len, device=device)[None, :] < lens[:, None]  # [B, L]
        qb = q[tok_idx].unsqueeze(2)  # [B, H, 1, D]
        res = self._sdpa(qb, k, v, mask[:, None, None, :], is_causal=False)
        out[tok_idx] = res.squeeze(2).to(out.dtype)

    def _prefill(self, q: torch.Tensor, out: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, md: AttentionMetadata, seq: int, start: int,
                 q_len: int, seq_len: int) -> None:
        """One sequence whose ``q_len`` new tokens are the last positions of ``seq_len``."""
        block_size = key_cache.shape[1]
        blocks = md.block_table[seq, : -(-seq_len // block_size)].long()
        k = self._gather_kv(key_cache, blocks, seq_len)  # [H, L, D]
        v = self._gather_kv(value_cache, blocks, seq_len)
        qs = q[start:start + q_len].transpose(0, 1)  # [H, q_len, D]
        if q_len == seq_len:  # nothing cached before: plain causal
            res = self._sdpa(qs, k, v, None, is_causal=True)
        else:  # query j sits at absolute position seq_len - q_len + j
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
            res = self._sdpa(qs, k, v, mask, is_causal=False)
        out[start:start + q_len] = res.transpose(0, 1).to(out.dtype)
