"""Quantized experts of a mixture-of-experts layer: which method a checkpoint's config makes, and
the 4-bit one (AWQ, GPTQ without activation order, compressed-tensors W4A16).

A method owns the layer's stacked expert tensors (w13 = gate rows then up rows, w2 = down),
loads each expert's checkpoint tensors into them (TP: a slice of every expert's intermediate
size; EP: whole local experts, decided by the layer, which passes ``rank`` / ``shards``) and
dequantizes the experts a call needs. The layer (moe.py) runs the experts: fused_moe_quant.py on
a GPU, else its host-grouped loop over the dequantized chosen experts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_volta.model_executor.layers.quantization import moe_w4_layout as w4

_W4_ROLES = {  # checkpoint suffix -> role, per format family
    "awq": {"qweight": "qweight", "qzeros": "zeros", "scales": "scales"},
    "gptq": {"qweight": "qweight", "qzeros": "zeros", "scales": "scales", "g_idx": "g_idx"},
    "compressed-tensors": {"weight_packed": "qweight", "weight_zero_point": "zeros", "weight_scale": "scales",
                           "weight_shape": "shape", "weight_g_idx": "g_idx"},
}


def make_moe_quant_method(config: Any) -> Any:
    """The expert method of a quantization config (None: dense experts); ValueError naming the
    field for formats the experts cannot hold."""
    if config is None:
        return None
    from vllm_volta.model_executor.layers.quantization.awq import AWQConfig
    from vllm_volta.model_executor.layers.quantization.fp8_config import Fp8Config
    from vllm_volta.model_executor.layers.quantization.packed_int import PackedIntConfig

    if isinstance(config, Fp8Config):
        from vllm_volta.model_executor.layers.quantization.moe_fp8 import Fp8MoEMethod
        return Fp8MoEMethod(config)
    if isinstance(config, AWQConfig):
        return W4MoEMethod(config.source, config.group_size)
    if isinstance(config, PackedIntConfig):
        if config.bits != 4:
            raise ValueError(f"quantization_config.bits: {config.bits}-bit mixture-of-experts weights are not "
                             "supported (4-bit and FP8 experts are)")
        if config.act_order:
            raise ValueError("quantization_config: mixture-of-experts weights in activation order (desc_act / "
                             "actorder) are not supported (4-bit experts with contiguous groups are)")
        fmt = config.fmt if config.quant_method == "gptq" else "compressed-tensors"
        return W4MoEMethod(fmt, config.group_size, symmetric=not config.has_zeros)
    raise ValueError(f"quantization_config: {type(config).__name__} mixture-of-experts weights are not supported "
                     "(AWQ, GPTQ, compressed-tensors 4-bit and FP8 experts are)")


class W4MoEMethod:
    """4-bit experts in the K-major layout (moe_w4_layout.py): ``w13_qweight`` [E, 2I, H/8],
    ``w13_sz`` [E, 2I, H/g, 2], ``w2_qweight`` [E, H, I/8], ``w2_sz`` [E, H, I/g, 2]."""

    kind = "w4"

    def __init__(self, fmt: str, group_size: int, symmetric: bool = False) -> None:
        self.fmt, self.group_size, self.symmetric = fmt, group_size, symmetric
        family = "gptq" if fmt in ("gptq", "gptq_v2") else fmt
        self.roles = _W4_ROLES[family]
        self.required = ("qweight", "scales") + (() if symmetric else ("zeros",))

    def describe(self) -> str:
        group = "per channel" if self.group_size == -1 else f"group size {self.group_size}"
        return f"{self.fmt} 4-bit experts, {group}, repacked K-major"

    def _groups(self, k: int, what: str) -> int:
        g = k if self.group_size == -1 else self.group_size
        if k % g or k % 32:
            raise ValueError(f"quantization_config.group_size: the {what} ({k} inputs per rank) must be a "
                             f"multiple of 32 and of the group size {g}")
        return k // g

    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int) -> None:
        def param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        g13, g2 = self._groups(hidden, "experts' hidden size"), self._groups(inter, "experts' intermediate size")
        layer.w13_qweight = param(experts, 2 * inter, hidden // 8, dtype=torch.int32)
        layer.w13_sz = param(experts, 2 * inter, g13, 2, dtype=torch.float16)
        layer.w2_qweight = param(experts, hidden, inter // 8, dtype=torch.int32)
        layer.w2_sz = param(experts, hidden, g2, 2, dtype=torch.float16)
        if self.symmetric:  # no zero point tensors: the stored zero is 8
            layer.w13_sz.data[..., 1] = 8.0
            layer.w2_sz.data[..., 1] = 8.0

    def param_names(self) -> tuple[str, ...]:
        return ("w13_qweight", "w13_sz", "w2_qweight", "w2_sz")

    def role(self, suffix: str) -> str | None:
        """The role of a checkpoint suffix (None: not one of this format's tensors)."""
        return self.roles.get(suffix)

    def load(self, layer: nn.Module, expert: int, part: str, suffix: str, loaded: torch.Tensor,
             rank: int, shards: int) -> None:
        """One checkpoint tensor of local ``expert``'s ``part`` (gate / up / down), sharded."""
        role = self.role(suffix)
        if role is None:
            raise ValueError(f"expert tensor suffix {suffix!r} is not part of a {self.fmt} checkpoint; "
                             f"expected one of {sorted(self.roles)}")
        if role == "shape":
            return
        if role == "g_idx":  # contiguous groups only: each row's group must be k // g
            k = loaded.numel()
            g = k if self.group_size == -1 else self.group_size
            if not torch.equal(loaded.long().cpu(), torch.arange(k) // g):
                raise ValueError("quantization_config: expert g_idx in activation order is not supported")
            return
        values = w4.checkpoint_values(self.fmt, role, loaded)
        n = layer.intermediate
        if part == "down":  # row-parallel: this rank's inputs (K) and their groups
            qweight, sz = layer.w2_qweight.data[expert], layer.w2_sz.data[expert]
            rows = n if role == "qweight" else sz.shape[1]
            if role != "qweight" and self.group_size == -1:
                rank, shards = 0, 1  # one group per channel: every rank holds it
            if values.shape[0] != rows * shards:
                raise ValueError(f"expert {suffix} has shape {tuple(loaded.shape)}: {values.shape[0]} rows, "
                                 f"expected {rows * shards}")
            values = values.narrow(0, rank * rows, rows)
            offset, cols = 0, qweight.shape[0]
        else:
            qweight, sz = layer.w13_qweight.data[expert], layer.w13_sz.data[expert]
            if values.shape[1] != n * shards:
                raise ValueError(f"expert {suffix} has shape {tuple(loaded.shape)}: {values.shape[1]} outputs, "
                                 f"expected {n * shards}")
            values = values.narrow(1, rank * n, n)
            offset, cols = (0 if part == "gate" else n), n
        target = {"qweight": qweight, "zeros": sz[..., 1], "scales": sz[..., 0]}[role]
        target = target[offset:offset + cols]
        packed = w4.pack_kmajor(values) if role == "qweight" else values.t().to(torch.float16)
        if packed.shape != target.shape:
            raise ValueError(f"expert {suffix} has shape {tuple(loaded.shape)}, which does not fit this "
                             f"layer's {tuple(target.shape)} ({self.describe()})")
        target.copy_(packed)

    def expert_weights(self, layer: nn.Module, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H], w2 [H, I]) of local ``expert`` in ``dtype`` (PyTorch dequantization)."""
        return (w4.dequantize(layer.w13_qweight[expert], layer.w13_sz[expert], dtype),
                w4.dequantize(layer.w2_qweight[expert], layer.w2_sz[expert], dtype))
