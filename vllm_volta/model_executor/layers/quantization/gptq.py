"""GPTQ checkpoints (AutoGPTQ / GPTQModel, ``quant_method: gptq``), 4 or 8 bits.

GPTQ's layout, per linear layer of K inputs and N outputs, b bits (p = 32 / b values per int32),
group size g (-1: one group, per output channel):
- ``qweight`` int32 [K / p, N]: p consecutive input rows per int32, row p*i + j in bits b*j;
- ``qzeros`` int32 [K / g, N / p]: the zero points of p consecutive columns, column p*c + j in
  bits b*j; format "gptq" (v1) stores zero - 1 (mod 2**b), "gptq_v2" the zero itself;
- ``scales`` [K / g, N]; ``g_idx`` [K], each row's group: k // g, or with activation order
  (``desc_act``) the group GPTQ gave row k when it quantized the rows in its own order;
- W[k, n] = (q[k, n] - zero[g_idx[k], n]) * s[g_idx[k], n]. ``sym`` only says how the zeros were
  chosen (2**(b-1)); they are stored either way.

4-bit without activation order is repacked to AWQ's layout (awq.py and, per channel,
packed_int.py); 8-bit and activation order are dequantized by g_idx (packed_int.py).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_volta.model_executor.layers.quantization.awq import AWQConfig, pack_awq
from vllm_volta.model_executor.layers.quantization.packed_int import Converter, PackedIntConfig, unpack_int

_NAMES = (("qweight", "qweight"), ("zeros", "qzeros"), ("scales", "scales"), ("g_idx", "g_idx"))


def gptq_config(qc: dict[str, Any]) -> AWQConfig | PackedIntConfig:
    """The config that serves a GPTQ ``quantization_config``: AWQConfig (4-bit, groups of rows, no
    activation order), else PackedIntConfig; ValueError naming the field."""
    bits, group = qc.get("bits", 4), qc.get("group_size", 128)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if bits not in (4, 8):
        raise ValueError(f"quantization_config.bits: GPTQ with {bits} bits is not supported (4 and 8 are)")
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or group >= 1):
        raise ValueError(f"quantization_config.group_size must be a positive int or -1 (per channel), "
                         f"got {group!r}")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"quantization_config.checkpoint_format {fmt!r} is not supported; supported: gptq, gptq_v2")
    for key in ("lm_head", "dynamic"):  # GPTQModel: a quantized lm_head, per-module overrides
        if qc.get(key):
            raise ValueError(f"quantization_config.{key}: {qc[key]!r} is not supported (every decoder linear "
                             "layer in the one format, the lm_head dense)")
    act_order = bool(qc.get("desc_act", False))
    if bits == 4 and group >= 1 and not act_order:
        return AWQConfig(group, source=fmt)
    return PackedIntConfig("gptq", fmt, bits, group, act_order, has_zeros=True, names=_NAMES)


def gptq_converter(config: PackedIntConfig) -> Converter:
    """Converts GPTQ tensors (by role) to ``config``'s layout (packed_int.py)."""
    mask = (1 << config.bits) - 1

    def convert(role: str, tensor: torch.Tensor) -> torch.Tensor:
        if role == "zeros":
            zeros = unpack_int(tensor, config.bits, 1)
            if config.fmt == "gptq":
                zeros = (zeros + 1) & mask
            return pack_awq(zeros) if config.layout == "awq" else zeros
        if role == "qweight" and config.layout == "awq":
            return gptq_tensor_to_awq("qweight", tensor, config.fmt)
        if role == "g_idx":
            return tensor.to(torch.int32)
        return tensor
    return convert


def gptq_tensor_to_awq(name: str, tensor: torch.Tensor, source: str) -> torch.Tensor:
    """A GPTQ checkpoint tensor (``name``: qweight, qzeros or scales) in AWQ's layout."""
    if name == "qweight":  # [K / 8, N] packed along K -> [K, N / 8] packed along N
        return pack_awq(unpack_int(tensor, 4, 0))
    if name == "qzeros":
        zeros = unpack_int(tensor, 4, 1)
        if source == "gptq":
            zeros = (zeros + 1) & 0xF
        return pack_awq(zeros)
    return tensor
