"""FP8 (e4m3) experts of a mixture-of-experts layer: the one-byte weights stay in memory and the
experts a call needs are dequantized to the activation dtype (no GPU below SM89 has FP8 math;
on SM89+ the same path runs: the chosen experts' bytes are read once either way).

Tensors: ``w13_weight`` float8_e4m3fn [E, 2I, H] (gate rows, then up), ``w2_weight`` [E, H, I];
scales float32: with block scales (bn x bk, ``weight_scale_inv`` / compressed-tensors ``block``)
``w13_scale`` [E, 2I / bn, ceil(H / bk)] and ``w2_scale`` [E, ceil(H / bn), I / bk]; per tensor or
per channel, one scale per output row, ``w13_scale`` [E, 2I] and ``w2_scale`` [E, H] (a tensor's
one scale spread over its rows, so gate and up keep their own). W = q * scale.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Fp8MoEMethod:
    """Loads and dequantizes FP8 experts of one ``Fp8Config`` (fp8_config.py)."""

    kind = "fp8"

    def __init__(self, config: Any) -> None:
        self.config = config
        self.block = config.block_shape if config.strategy == "block" else None
        self.required = ("weight", "scale")

    def describe(self) -> str:
        what = f"block {self.block[0]}x{self.block[1]}" if self.block else f"per-{self.config.strategy}"
        return f"FP8 e4m3 experts ({what} scales), dequantized per call for the chosen experts"

    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int) -> None:
        def param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        layer.w13_weight = param(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn)
        layer.w2_weight = param(experts, hidden, inter, dtype=torch.float8_e4m3fn)
        if self.block is None:
            layer.w13_scale = param(experts, 2 * inter, dtype=torch.float32)
            layer.w2_scale = param(experts, hidden, dtype=torch.float32)
            return
        bn, bk = self.block
        if inter % bn or inter % bk:
            raise ValueError(f"quantization_config: the experts' intermediate size per rank ({inter}) must be a "
                             f"multiple of the FP8 block {bn}x{bk}")
        layer.w13_scale = param(experts, 2 * inter // bn, _cdiv(hidden, bk), dtype=torch.float32)
        layer.w2_scale = param(experts, _cdiv(hidden, bn), inter // bk, dtype=torch.float32)

    def param_names(self) -> tuple[str, ...]:
        return ("w13_weight", "w13_scale", "w2_weight", "w2_scale")

    def role(self, suffix: str) -> str | None:
        if suffix == "weight":
            return "weight"
        if suffix == self.config.scale_name:
            return "scale"
        if suffix == "input_scale":  # static activation scales: activations stay float here
            return "ignored"
        return None

    def load(self, layer: nn.Module, expert: int, part: str, suffix: str, loaded: torch.Tensor,
             rank: int, shards: int) -> None:
        role = self.role(suffix)
        if role is None:
            raise ValueError(f"expert tensor suffix {suffix!r} is not part of this FP8 checkpoint; expected "
                             f"weight, {self.config.scale_name} or input_scale")
        if role == "ignored":
            return
        n = layer.intermediate
        down = part == "down"
        if role == "weight":
            dst = layer.w2_weight.data[expert] if down else layer.w13_weight.data[expert]
            dim, rows = (1, n) if down else (0, n)
            offset = 0 if part != "up" else n
        elif self.block is None:
            dst = layer.w2_scale.data[expert] if down else layer.w13_scale.data[expert]
            full = layer.w2_weight.shape[1] if down else n * shards
            loaded = loaded.float().flatten()
            loaded = loaded.expand(full) if loaded.numel() == 1 else loaded
            if down:  # row scales of the down projection's outputs: every rank holds all
                rank, shards, rows = 0, 1, full
            dim, rows, offset = 0, (full if down else n), (0 if part != "up" else n)
        else:
            bn, bk = self.block
            dst = layer.w2_scale.data[expert] if down else layer.w13_scale.data[expert]
            dim, rows = (1, n // bk) if down else (0, n // bn)
            offset = 0 if part != "up" else n // bn
        if loaded.shape[dim] != rows * shards:
            raise ValueError(f"expert {part} {suffix} has shape {tuple(loaded.shape)}, expected {rows * shards} "
                             f"along dimension {dim}")
        part_rows = loaded.narrow(dim, rank * rows, rows)
        target = dst.narrow(0, offset, rows) if not down else dst
        if part_rows.shape != target.shape:
            raise ValueError(f"expert {part} {suffix} has shape {tuple(loaded.shape)}, which does not fit this "
                             f"layer's {tuple(target.shape)}")
        target.copy_(part_rows)

    def dequantize(self, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """W [..., N, K] in ``dtype`` from FP8 ``weight`` and its ``scale`` (leading dims alike)."""
        n, k = weight.shape[-2:]
        if self.block is None:
            return (weight.to(torch.float32) * scale.unsqueeze(-1)).to(dtype)
        bn, bk = self.block
        s = scale.repeat_interleave(bn, -2)[..., :n, :].repeat_interleave(bk, -1)[..., :k]
        return (weight.to(torch.float32) * s).to(dtype)

    def expert_weights(self, layer: nn.Module, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.dequantize(layer.w13_weight[expert], layer.w13_scale[expert], dtype),
                self.dequantize(layer.w2_weight[expert], layer.w2_scale[expert], dtype))

    def gathered_weights(self, layer: nn.Module, experts: torch.Tensor,
                         dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [n, 2I, H], w2 [n, H, I]) of local ``experts`` (int64 [n]) in ``dtype``: only
        their bytes are read (no host sync: CUDA-graph safe)."""
        def pick(weight: torch.Tensor) -> torch.Tensor:  # gathered as bytes: not every device indexes FP8
            return weight.view(torch.uint8).index_select(0, experts).view(weight.dtype)

        return (self.dequantize(pick(layer.w13_weight), layer.w13_scale.index_select(0, experts), dtype),
                self.dequantize(pick(layer.w2_weight), layer.w2_scale.index_select(0, experts), dtype))
