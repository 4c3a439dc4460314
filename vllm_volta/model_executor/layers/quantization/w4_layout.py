"""The K-major 4-bit layout the CUDA W4A16 kernels read (csrc/kernels/w4.cuh), and the repacking
into it from the checkpoint's AWQ layout (pure PyTorch: runs at load on the layer's device).

Layout, for a weight of K inputs, N outputs and groups of g consecutive input rows (G = K / g):
- ``qweight`` int32 [N, K / 8]: output row n's K values contiguous (a thread's 16-byte load is 32
  consecutive k of one row); int32 j of row n holds k = 8j + 2i + h (i = 0..3, h = 0..1) in bits
  4i + 16h, so masking with 0x000F000F / 0x00F000F0 (after a shift by 0 or 8) yields two
  consecutive k as the two halves of a half2 (the 0x6400 magic-number dequantization);
- ``sz`` float16 [N, G, 2]: the scale s and the zero point z (an integer, exact in float16) of
  row n's group, adjacent so one 4-byte load serves a group;
- W[k, n] = (q - z) * s, as in the AWQ / GPTQ formats.

The kernels need K a multiple of 32 and g = 32 * 2**e (or one group, g = K): a 32-value chunk
never straddles two groups and a chunk's group is a shift away. ``supported`` says whether a
shape qualifies; other layers stay in AWQ's layout.
"""

from __future__ import annotations

import torch

CHUNK_K = 32  # k values per 16-byte load
# Bit position of k = 8j + t (t = 2i + h) inside int32 j: 4i + 16h.
_SHIFTS = tuple(4 * (t // 2) + 16 * (t % 2) for t in range(8))


def supported(k: int, n: int, group_size: int) -> bool:
    """Whether a K x N weight with groups of ``group_size`` rows fits the kernels' layout."""
    if k <= 0 or n <= 0 or k % CHUNK_K or k % group_size:
        return False
    if group_size == k:
        return True
    ratio = group_size // CHUNK_K
    return group_size % CHUNK_K == 0 and ratio & (ratio - 1) == 0


def group_shift(k: int, group_size: int) -> int:
    """log2(chunks per group) for the kernels (chunk c is in group c >> shift); 31 for one group."""
    if group_size == k:
        return 31
    return (group_size // CHUNK_K).bit_length() - 1


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2**32) -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_kmajor(q: torch.Tensor) -> torch.Tensor:
    """4-bit values int [K, N] (0..15) -> ``qweight`` int32 [N, K / 8] in the K-major layout."""
    k, n = q.shape
    if k % 8:
        raise ValueError(f"pack_kmajor: K must be a multiple of 8, got {k}")
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=q.device)
    values = q.t().long().reshape(n, k // 8, 8)
    return _to_int32((values << shifts).sum(-1))  # disjoint bits: sum = or


def unpack_kmajor(qweight: torch.Tensor) -> torch.Tensor:
    """``qweight`` int32 [N, K / 8] -> the 4-bit values int32 [K, N] (inverse of pack_kmajor)."""
    n, words = qweight.shape
    shifts = torch.tensor(_SHIFTS, dtype=torch.int32, device=qweight.device)
    values = (qweight.unsqueeze(-1) >> shifts) & 0xF
    return values.reshape(n, words * 8).t().contiguous()


def pack_scales_zeros(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """scales [G, N] and zero points int [G, N] -> ``sz`` float16 [N, G, 2]."""
    return torch.stack((scales.to(torch.float16), zeros.to(torch.float16)), dim=-1).transpose(0, 1).contiguous()


def repack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               max_cols: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ-layout tensors (qweight [K, N/8], qzeros [G, N/8], scales [G, N]) -> (qweight [N, K/8],
    sz [N, G, 2]) in the K-major layout, ``max_cols`` output columns at a time (bounded
    temporaries: the unpacked int64 values of a whole projection would be 16x its bytes)."""
    from vllm_volta.model_executor.layers.quantization.awq import unpack_awq

    k, packed_cols = qweight.shape
    out = torch.empty(packed_cols * 8, k // 8, dtype=torch.int32, device=qweight.device)
    step = max(1, max_cols // 8)
    for c0 in range(0, packed_cols, step):
        c1 = min(packed_cols, c0 + step)
        out[c0 * 8:c1 * 8] = pack_kmajor(unpack_awq(qweight[:, c0:c1]))
    return out, pack_scales_zeros(scales, unpack_awq(qzeros))


def unpack_w4(qweight: torch.Tensor, sz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [K, N], z int32 [G, N], s float16 [G, N]) of the K-major layout."""
    return unpack_kmajor(qweight), sz[..., 1].t().to(torch.int32), sz[..., 0].t().contiguous()


def dequantize_w4_torch(qweight: torch.Tensor, sz: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in ``dtype`` from the K-major layout, in PyTorch ops."""
    q, z, s = unpack_w4(qweight, sz)
    g = q.shape[0] // z.shape[0]
    return (q - z.repeat_interleave(g, 0)).to(dtype) * s.to(dtype).repeat_interleave(g, 0)
