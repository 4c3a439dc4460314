"""GGUF linear layers on CUDA: Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights stay in their GGUF blocks.

A GGUF model's config carries ``quantization_config = {"quant_method": "gguf"}``
(model_loader/gguf_config.py). Layers built on a CUDA device take ``GGUFLinearMethod``; elsewhere
(the CPU) they stay dense and the loader dequantizes every tensor, as before.

Each layer receives its checkpoint tensors from iterate_gguf_weights: uint8 [N, row_bytes] GGUF
blocks tagged with their type (model_loader/gguf_blocks.py), or float tensors for other types. Once
every part has arrived (q, k, v or gate, up are separate GGUF tensors, maybe of different types)
the layer keeps its rows in blocks when every part is a kept type, the model runs in float16 and
this build has the kernels; otherwise it dequantizes them and becomes a plain dense layer
(``quant_method`` None: the dense decode kernels and fusions apply to it again). Kept rows: this rank's rows
of each part (the linear layer's own tensor-parallel loader picks them), consecutive parts of one
type concatenated, all in one uint8 ``weight`` (16-byte aligned parts). A row-parallel layer
splits K on whole blocks (256 weights for K-quants); where its share of K is not whole blocks the
layer is dequantized, with a log line.

x W^T: for 1-8 rows one ``gguf_gemv`` per part (decode); above, ``gguf_dequantize`` of every part
into one float16 scratch weight, then cuBLAS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers.quantization import gguf_parts
from vllm_volta.model_executor.model_loader.gguf_blocks import KEPT_TYPES

logger = init_logger(__name__)

GEMV_MAX_ROWS = 8  # gguf_gemv's rows
_KEPT_NAMES = ", ".join(sorted(t.name for t in KEPT_TYPES))


def kernels_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when gguf_gemv / gguf_dequantize serve layers on ``device`` in ``dtype``, else why not."""
    if device.type != "cuda":
        return f"the GGUF kernels need a CUDA GPU (here {device.type})"
    if dtype != torch.float16:
        return f"the GGUF kernels compute in float16 (here {str(dtype).removeprefix('torch.')})"
    from vllm_volta import _custom_ops as ops

    try:
        built = ops.has_cuda_kernel("gguf_gemv")
    except RuntimeError:  # an extension built before the op existed
        return "this build of vllm_volta._C predates gguf_gemv (rebuild it)"
    return None if built else "this build of vllm_volta._C has no CUDA kernels"


@dataclass
class GGUFConfig:
    """GGUF checkpoints; counts what the layers kept for the load log (one config per model load)."""

    quant_method: str = "gguf"
    kept: dict[str, list[int]] = field(default_factory=dict)  # type -> [checkpoint tensors, bytes]
    float16_bytes: list[int] = field(default_factory=lambda: [0])  # the kept weights' size in float16
    dense: dict[str, int] = field(default_factory=dict)  # why dequantized -> layers
    layers: list[int] = field(default_factory=lambda: [0, 0])  # [built, loaded]

    def describe(self) -> str:
        return f"GGUF blocks ({_KEPT_NAMES} kept quantized on CUDA in float16; other types dequantized at load)"

    def kernel_path(self, device: torch.device, dtype: torch.dtype) -> str:
        why_not = kernels_reason(device, dtype)
        if why_not is not None:
            return f"dequantized at load, then the dense GEMMs ({why_not})"
        return (f"GGUF blocks decoded in registers: gguf_gemv for steps of up to {GEMV_MAX_ROWS} rows, "
                "gguf_dequantize + cuBLAS above")

    def get_quant_method(self) -> GGUFLinearMethod | None:
        # Layers are built under torch.device(target): on the CPU they stay plain dense layers.
        if torch.get_default_device().type != "cuda":
            return None
        return GGUFLinearMethod(self)

    def layer_done(self) -> None:
        """Count a loaded layer; after the last one, log what stays in blocks (once per model)."""
        self.layers[1] += 1
        if self.layers[1] != self.layers[0]:
            return
        kept = ", ".join(f"{name}: {n} linear weights, {nbytes / 2**30:.2f} GiB"
                         for name, (n, nbytes) in sorted(self.kept.items()))
        dense = "; ".join(f"{n} layers dequantized at load ({why})" for why, n in sorted(self.dense.items()))
        total = sum(nbytes for _, nbytes in self.kept.values())
        size = f" ({total / 2**30:.2f} GiB, {self.float16_bytes[0] / 2**30:.2f} GiB in float16)" if total else ""
        logger.info("GGUF %s kept quantized on the GPU%s%s", kept or "no linear weights", size,
                    f"; {dense}" if dense else "")


def _shards(layer: nn.Module) -> list[Any]:
    """The checkpoint shard ids a layer's weight is loaded from (one tensor each)."""
    if hasattr(layer, "q_size"):
        return ["q", "k", "v"]
    if hasattr(layer, "output_sizes"):
        return list(range(len(layer.output_sizes)))
    return [None]


class GGUFLinearMethod:
    """Receives a linear layer's GGUF tensors, keeps them in blocks or dense, computes x W^T."""

    def __init__(self, config: GGUFConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype | None) -> None:
        device = torch.get_default_device()
        layer.dense_dtype = params_dtype or torch.get_default_dtype()
        layer.gguf_why_dense = kernels_reason(device, layer.dense_dtype)
        layer.gguf_pending = {}
        layer.gguf_parts = None  # list of gguf_parts.Part once loaded in blocks
        # A placeholder until every part has arrived (its shape depends on the parts' types).
        layer.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        layer.weight.weight_loader = self._loader(layer)
        self.config.layers[0] += 1
        info_once(logger, "GGUF linear layers on %s: %s", device,
                  self.config.kernel_path(device, layer.dense_dtype))

    def _loader(self, layer: nn.Module) -> Callable[..., None]:
        expected = set(_shards(layer))

        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            shard_id = shard[0] if shard else None
            layer.gguf_pending[shard_id] = loaded
            # None: the whole weight in one tensor (for q/k/v or gate/up: already fused).
            if shard_id is None or set(layer.gguf_pending) >= expected:
                self._finish(layer)
        return load

    def _finish(self, layer: nn.Module) -> None:
        pending, layer.gguf_pending = layer.gguf_pending, {}
        fused = None in pending and len(_shards(layer)) > 1
        why = layer.gguf_why_dense or ("an already-fused checkpoint tensor" if fused else None)
        why = why or gguf_parts.why_not_blocks(layer, pending)
        if why is None:
            parts = gguf_parts.gather_parts(layer, pending)
            layer.weight = nn.Parameter(gguf_parts.pack(parts), requires_grad=False)
            layer.gguf_parts = parts
            for part in parts:
                stats = self.config.kept.setdefault(part.qtype.name, [0, 0])
                stats[0] += part.tensors
                stats[1] += part.blocks.numel()
                self.config.float16_bytes[0] += part.rows * layer.input_size * 2
        else:
            self._make_dense(layer, pending)
            self.config.dense[why] = self.config.dense.get(why, 0) + 1
            info_once(logger, "GGUF linear layers dequantized at load: %s", why)
        self.config.layer_done()

    @staticmethod
    def _make_dense(layer: nn.Module, pending: dict[Any, torch.Tensor]) -> None:
        from vllm_volta.model_executor.layers.decode_gemv import gemv_enabled

        device = layer.weight.device
        layer.weight = nn.Parameter(torch.empty(layer.output_size, layer.input_size, dtype=layer.dense_dtype,
                                                device=device), requires_grad=False)
        for shard_id, tensor in pending.items():
            dense = gguf_parts.dequantized(tensor).to(layer.dense_dtype)
            args = () if shard_id is None else (shard_id,)
            layer.weight_loader(layer.weight, dense, *args)
        # From here on a plain dense layer: its decode paths (gemv, fused norm / residual add) too.
        layer.quant_method = None
        layer.use_gemv = gemv_enabled()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] -> x W^T + bias [..., N]."""
        parts = layer.gguf_parts
        if parts is None:
            if layer.weight.dim() != 2:
                raise RuntimeError("GGUF linear layer used before all of its checkpoint tensors were loaded")
            from vllm_volta.model_executor.layers.decode_gemv import linear

            return linear(x, layer.weight, bias, layer.use_gemv)
        return gguf_linear(x, parts, layer.output_size, bias)


def gguf_linear(x: torch.Tensor, parts: list[gguf_parts.Part], n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] float16 -> x W^T + bias [..., N] float16, W the rows of ``parts`` (CUDA)."""
    from vllm_volta import _custom_ops as ops

    k = x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    if m == 0:
        return x.new_empty(*x.shape[:-1], n)
    # The kernels read whole 16-byte vectors of each row: a fresh copy where the rows are not.
    if rows.stride(-1) != 1 or (m > 1 and rows.stride(0) % 8) or rows.data_ptr() % 16:
        rows = rows.clone(memory_format=torch.contiguous_format)
    if m <= GEMV_MAX_ROWS:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        for p in parts:
            part_bias = None if bias is None else bias[p.row0:p.row0 + p.rows]
            ops.gguf_gemv(out[:, p.row0:p.row0 + p.rows], rows, p.blocks, int(p.qtype), part_bias)
    else:
        dense = torch.empty(n, k, dtype=x.dtype, device=x.device)
        for p in parts:
            ops.gguf_dequantize(dense[p.row0:p.row0 + p.rows], p.blocks, int(p.qtype))
        out = F.linear(rows, dense, bias)
    return out.view(*x.shape[:-1], n)
