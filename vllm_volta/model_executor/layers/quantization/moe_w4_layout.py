"""The stacked 4-bit expert layout the MoE W4 kernels read (csrc/kernels/moe_w4.cuh), and the
conversion of each checkpoint format's per-expert tensors into plain values.

Per expert e and projection of K inputs, N outputs, groups of g consecutive inputs (G = K / g):
- ``qweight`` int32 [E, N, K / 8]: output row n's K values contiguous, so one 16-byte load is 32
  consecutive k of one row; int32 j holds k = 8j + 2i + h (i = 0..3, h = 0..1) in bits 4i + 16h:
  masking with 0x000F000F (0x00F000F0) after a shift by 0 or 8 leaves two consecutive k in the two
  halves of a half2 (the 0x6400 magic-number dequantization);
- ``sz`` float16 [E, N, G, 2]: the scale and the zero point (an integer, exact in float16) of row
  n's group, adjacent so one 4-byte load serves a group;
- W[n, k] = (q - z) * s, as AWQ / GPTQ / compressed-tensors define it.

Checkpoint formats, each turned into values q [K, N], zeros [G, N] and scales [G, N] per role:
AWQ (qweight [K, N/8] in AWQ's nibble order 0 2 4 6 1 3 5 7, qzeros alike), GPTQ (qweight
[K/8, N] packed along K, qzeros [G, N/8] along N holding z - 1 mod 16 in format "gptq"),
compressed-tensors pack-quantized (weight_packed [N, K/8], weight_zero_point [N/8, G], values
offset by 8; symmetric schemes store no zero point: z = 8).
"""

from __future__ import annotations

import torch

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column _AWQ_ORDER[i]
# Bit position of k = 8j + t (t = 2i + h) inside int32 j: 4i + 16h.
_KMAJOR_SHIFTS = tuple(4 * (t // 2) + 16 * (t % 2) for t in range(8))


def unpack_along(packed: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 with eight 4-bit values per element along ``dim`` -> int32 values, 8x as long there.
    Value j of an int32 sits in bits 4j, or with ``order`` (AWQ) value order[i] in bits 4i."""
    shifts = list(range(0, 32, 4))
    if order is not None:
        shifts = [0] * 8
        for i, col in enumerate(order):
            shifts[col] = 4 * i
    shape = [8] + [1] * (packed.dim() - dim - 1)
    s = torch.tensor(shifts, dtype=torch.int32, device=packed.device).view(shape)
    values = (packed.to(torch.int32).unsqueeze(dim + 1) >> s) & 0xF
    return values.flatten(dim, dim + 1)


def checkpoint_values(fmt: str, role: str, tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint tensor of one expert projection as values oriented [K, N] ("qweight") or
    [G, N] ("zeros", "scales"). ``fmt``: "awq", "gptq", "gptq_v2" or "compressed-tensors"."""
    if fmt == "awq":
        return tensor if role == "scales" else unpack_along(tensor, 1, _AWQ_ORDER)
    if fmt in ("gptq", "gptq_v2"):
        if role == "qweight":
            return unpack_along(tensor, 0)
        if role == "zeros":
            zeros = unpack_along(tensor, 1)
            return (zeros + 1) & 0xF if fmt == "gptq" else zeros
        return tensor
    if fmt == "compressed-tensors":
        if role == "qweight":
            return unpack_along(tensor, 1).t()
        if role == "zeros":
            return unpack_along(tensor, 0).t()
        return tensor.t()
    raise ValueError(f"4-bit expert format must be awq, gptq, gptq_v2 or compressed-tensors, got {fmt!r}")


def pack_kmajor(q: torch.Tensor) -> torch.Tensor:
    """4-bit values [K, N] -> int32 [N, K / 8] in the K-major layout."""
    k, n = q.shape
    if k % 8:
        raise ValueError(f"pack_kmajor: K must be a multiple of 8, got {k}")
    shifts = torch.tensor(_KMAJOR_SHIFTS, dtype=torch.int64, device=q.device)
    words = (q.t().long().reshape(n, k // 8, 8) << shifts).sum(-1)  # disjoint bits: sum = or
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_kmajor(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [..., N, K / 8] in the K-major layout -> the values int32 [..., N, K]."""
    shifts = torch.tensor(_KMAJOR_SHIFTS, dtype=torch.int32, device=qweight.device)
    return ((qweight.unsqueeze(-1) >> shifts) & 0xF).flatten(-2)


def dequantize(qweight: torch.Tensor, sz: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W [..., N, K] in ``dtype`` from ``qweight`` [..., N, K/8] and ``sz`` [..., N, G, 2]
    (PyTorch ops; the scale applied once, in ``dtype``, to the exact q - z)."""
    q = unpack_kmajor(qweight)
    groups = sz.shape[-2]
    per = q.shape[-1] // groups
    q = q.unflatten(-1, (groups, per))
    w = (q - sz[..., 1:].to(torch.int32)).to(dtype) * sz[..., :1].to(dtype)
    return w.flatten(-2)
