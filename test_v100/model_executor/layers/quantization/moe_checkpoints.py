"""Quantized expert tensors for tests, written from the published formats (not from vllm_volta's
code). Per projection W [N, K] (HF Linear layout), groups of g inputs, W = (q - z) * s:
- AWQ: qweight int32 [K, N/8], column ORDER[i] of each 8 in bits 4i; qzeros [K/g, N/8] alike; scales [K/g, N].
- GPTQ: qweight int32 [K/8, N], row 8i + j in bits 4j; qzeros [K/g, N/8] along N, z - 1 (mod 16)
  in format "gptq", z in "gptq_v2"; scales [K/g, N]; g_idx [K] = k // g.
- compressed-tensors pack-quantized: weight_packed [N, K/8] along K; weight_zero_point [N/8, G]
  along N (asymmetric only; symmetric means z = 8); weight_scale [N, G]; weight_shape (N, K).
- FP8 e4m3: weight [N, K] float8, W = q * scale; block scales [ceil(N/bn), ceil(K/bk)]
  (``weight_scale_inv``), else one per tensor (``weight_scale`` [1]) or per row ([N, 1]).
"""

from __future__ import annotations

import torch

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
FP8_MAX = 448.0


def pack(values: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """4-bit values -> int32 with 8 per element along ``dim``; value j in bits 4j (or, with
    ``order``, value order[i] in bits 4i)."""
    v = values.long().movedim(dim, 0)
    v = v.reshape(v.shape[0] // 8, 8, *v.shape[1:])
    positions = order or tuple(range(8))
    words = sum(v[:, positions[i]] << (4 * i) for i in range(8))
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(0, dim).contiguous()


def quantize_w4(w: torch.Tensor, group: int, sym: bool = False):
    """Round-to-nearest 4-bit of W [N, K] (min / max per row and group; symmetric: z = 8).
    Returns (q [N, K], z [G, N], s [G, N] float16, W' [N, K] float64 = the dequantized value)."""
    n, k = w.shape
    g = k if group == -1 else group
    parts = w.double().reshape(n, k // g, g)
    if sym:
        s = (parts.abs().amax(-1) / 7).clamp_min(1e-6)
        z = torch.full(s.shape, 8, dtype=torch.long)
    else:
        lo, hi = parts.amin(-1).clamp(max=0), parts.amax(-1).clamp(min=0)
        s = ((hi - lo) / 15).clamp_min(1e-6)
        z = torch.round(-lo / s.half().double()).long().clamp(0, 15)
    s = s.half()
    q = (torch.round(parts / s.double().unsqueeze(-1)) + z.unsqueeze(-1)).clamp(0, 15).long()
    dense = ((q - z.unsqueeze(-1)).double() * s.double().unsqueeze(-1)).reshape(n, k)
    return q.reshape(n, k), z.t().contiguous(), s.t().contiguous(), dense


def w4_tensors(fmt: str, q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, sym: bool = False) -> dict:
    """The checkpoint tensors of one projection (q [N, K], z / s [G, N]) in ``fmt``."""
    if fmt == "awq":
        return {"qweight": pack(q.t(), 1, ORDER), "qzeros": pack(z, 1, ORDER), "scales": s}
    if fmt in ("gptq", "gptq_v2"):
        stored = (z - 1) & 0xF if fmt == "gptq" else z
        k, g = q.shape[1], z.shape[0]
        return {"qweight": pack(q.t(), 0), "qzeros": pack(stored, 1), "scales": s,
                "g_idx": (torch.arange(k) // (k // g)).to(torch.int32)}
    out = {"weight_packed": pack(q, 1), "weight_scale": s.t().contiguous(),
           "weight_shape": torch.tensor(list(q.shape))}
    if not sym:
        out["weight_zero_point"] = pack(z.t(), 0)
    return out


def w4_config(fmt: str, group: int, sym: bool = False) -> dict:
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
    if fmt in ("gptq", "gptq_v2"):
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": sym,
                "checkpoint_format": fmt}
    weights = {"num_bits": 4, "type": "int", "symmetric": sym, "dynamic": False,
               "strategy": "channel" if group == -1 else "group", "group_size": None if group == -1 else group}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}


def quantize_fp8(w: torch.Tensor, scheme: str, block: tuple[int, int] = (32, 32)):
    """FP8 of W [N, K]: ``scheme`` "block", "tensor" or "channel". (tensors, W' float64)."""
    n, k = w.shape
    w = w.float()
    if scheme == "block":
        bn, bk = block
        pad = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
        pad[:n, :k] = w
        amax = pad.reshape(pad.shape[0] // bn, bn, pad.shape[1] // bk, bk).abs().amax((1, 3))
        scale = (amax / FP8_MAX).clamp_min(1e-8)
        full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        name = "weight_scale_inv"
    elif scheme == "tensor":
        scale = (w.abs().amax() / FP8_MAX).clamp_min(1e-8).reshape(1)
        full, name = scale, "weight_scale"
    else:
        scale = (w.abs().amax(1, keepdim=True) / FP8_MAX).clamp_min(1e-8)
        full, name = scale, "weight_scale"
    q = (w / full).to(torch.float8_e4m3fn)
    return {"weight": q, name: scale}, q.double() * full.double()


def fp8_config(scheme: str, block: tuple[int, int] = (32, 32)) -> dict:
    if scheme == "block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    if scheme == "tensor":
        return {"quant_method": "fp8", "activation_scheme": "dynamic"}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "channel"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}
