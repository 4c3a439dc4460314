"""GPTQ 4-bit checkpoints (AutoGPTQ / GPTQModel, ``quant_method: gptq``), served through the AWQ
layout and kernels (awq.py): each tensor is repacked as it loads.

GPTQ's layout, per linear layer of K inputs and N outputs, group size g:
- ``qweight`` int32 [K / 8, N]: eight 4-bit weights of 8 consecutive input rows per int32, row
  8i + j in bits 4j .. 4j + 3;
- ``qzeros`` int32 [K / g, N / 8]: the zero points of 8 consecutive columns, column 8c + j in
  bits 4j; format "gptq" (v1) stores zero - 1 (mod 16), "gptq_v2" the zero itself;
- ``scales`` [K / g, N]; ``g_idx`` [K], each row's group: k // g unless the checkpoint was
  quantized in activation order (``desc_act``), which is not supported;
- W[k, n] = (q[k, n] - zero[k // g, n]) * s[k // g, n], as AWQ's.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_volta.model_executor.layers.quantization.awq import AWQConfig, pack_awq

_SHIFTS = tuple(range(0, 32, 4))


def gptq_config(qc: dict[str, Any]) -> AWQConfig:
    """The AWQConfig that serves a GPTQ ``quantization_config``; ValueError naming the field."""
    bits, group = qc.get("bits", 4), qc.get("group_size", 128)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if bits != 4:
        raise ValueError(f"quantization_config.bits: GPTQ with {bits} bits is not supported (4 is)")
    if qc.get("desc_act"):
        raise ValueError("quantization_config.desc_act: GPTQ in activation order is not supported "
                         "(checkpoints quantized with desc_act=false are)")
    if not isinstance(group, int) or group < 1:
        raise ValueError(f"quantization_config.group_size must be a positive int (per-channel GPTQ, "
                         f"-1, is not supported), got {group!r}")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"quantization_config.checkpoint_format {fmt!r} is not supported; supported: gptq, gptq_v2")
    return AWQConfig(group, source=fmt)


def _nibbles(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 packed along ``dim`` (value j of each 8 in bits 4j) -> its 4-bit values, 8x as long there."""
    shifts = torch.tensor(_SHIFTS, dtype=torch.int32, device=packed.device)
    values = (packed.unsqueeze(dim + 1) >> shifts.view([-1] + [1] * (packed.dim() - dim - 1))) & 0xF
    return values.flatten(dim, dim + 1)


def gptq_tensor_to_awq(name: str, tensor: torch.Tensor, source: str) -> torch.Tensor:
    """A GPTQ checkpoint tensor (``name``: qweight, qzeros or scales) in AWQ's layout."""
    if name == "qweight":  # [K / 8, N] packed along K -> [K, N / 8] packed along N
        return pack_awq(_nibbles(tensor.to(torch.int32), 0))
    if name == "qzeros":
        zeros = _nibbles(tensor.to(torch.int32), 1)
        if source == "gptq":
            zeros = (zeros + 1) & 0xF
        return pack_awq(zeros)
    return tensor
