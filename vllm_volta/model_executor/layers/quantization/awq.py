"""AWQ 4-bit weights (AutoAWQ's "gemm" layout, as the hub's ``*-AWQ`` checkpoints ship them).

Per linear layer with input size K and output size N, group size g:
- ``qweight`` int32 [K, N / 8]: eight 4-bit weights per int32, of 8 consecutive output columns;
  nibble i (bits 4i .. 4i + 3) holds column ``AWQ_PACK_ORDER[i]`` of the 8;
- ``qzeros`` int32 [K / g, N / 8]: the zero points, packed the same way;
- ``scales`` [K / g, N] (float16);
- the weight is W[k, n] = (q[k, n] - z[k // g, n]) * s[k // g, n], and y = x W (+ bias).

The layer keeps the packed tensors (a quarter of float16's bytes). On CUDA in float16 they are
repacked at the first call into the K-major layout of the W4A16 kernels (w4_linear.py: decode
GEMV, tensor-core GEMM, dequantize + cuBLAS for long inputs), where the shape allows (K a
multiple of 32, groups of 32 * 2**e rows); other shapes keep this layout: decode rows (up to 4)
through ``awq_gemv`` and larger inputs through ``awq_dequantize`` + cuBLAS. Elsewhere the same
dequantization runs as PyTorch ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACK = 8  # 4-bit values per int32
GEMV_MAX_ROWS = 4  # awq_gemv's rows


@dataclass(frozen=True)
class AWQConfig:
    """4-bit weights in AWQ's layout. ``source``: the checkpoint's format, "awq", or "gptq" /
    "gptq_v2" (GPTQ tensors, repacked to this layout as they load: gptq.py).
    ``modules_to_not_convert``: the checkpoint's float layers; when it names any, each layer
    becomes dense or packed by the first tensor the checkpoint holds for it (dense_or_packed.py)."""

    group_size: int
    source: str = "awq"
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, qc: dict[str, Any]) -> AWQConfig:
        """From a checkpoint's ``quantization_config`` (transformers' or AutoAWQ's key names)."""
        bits = qc.get("bits", qc.get("w_bit", 4))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        version = str(qc.get("version", "gemm")).lower()
        if bits != 4:
            raise ValueError(f"quantization_config.bits: AWQ with {bits} bits is not supported (4 is)")
        if version != "gemm":
            raise ValueError(f"quantization_config.version: AWQ {version!r} is not supported (gemm is)")
        if not qc.get("zero_point", True):
            raise ValueError("quantization_config.zero_point: AWQ without zero points is not supported")
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"quantization_config.group_size must be a positive int, got {group!r}")
        skip = qc.get("modules_to_not_convert")
        skip = [] if skip is None else skip
        if not isinstance(skip, (list, tuple)) or not all(isinstance(m, str) for m in skip):
            raise ValueError("quantization_config.modules_to_not_convert must be a list of module names "
                             f"(strings) or null, got {skip!r}")
        return cls(group, modules_to_not_convert=tuple(skip))

    @property
    def quant_method(self) -> str:
        """The checkpoint's ``quant_method``: "awq", or "gptq" for GPTQ tensors repacked here."""
        return "awq" if self.source == "awq" else "gptq"

    def kernel_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return kernel_path(device, dtype)

    def get_quant_method(self) -> AWQLinearMethod:
        """The linear method a layer built under this config uses (each config makes its own)."""
        if self.modules_to_not_convert:  # the checkpoint keeps some layers float
            from vllm_volta.model_executor.layers.quantization.dense_or_packed import AWQDenseOrPackedMethod
            return AWQDenseOrPackedMethod(self)
        return AWQLinearMethod(self)

    def describe(self) -> str:
        if self.source == "awq":
            dense = (f"; dense where the checkpoint holds float weights (modules_to_not_convert: "
                     f"{', '.join(self.modules_to_not_convert)})" if self.modules_to_not_convert else "")
            return f"AWQ 4-bit, group size {self.group_size}{dense}"
        return f"GPTQ 4-bit ({self.source}), group size {self.group_size}, repacked to AWQ's layout"


def _nibble_shifts(device: torch.device) -> torch.Tensor:
    """The bit shift of each of the 8 columns of a packed int32 (column AWQ_PACK_ORDER[i] at 4i)."""
    shifts = [0] * PACK
    for i, col in enumerate(AWQ_PACK_ORDER):
        shifts[col] = 4 * i
    return torch.tensor(shifts, dtype=torch.int32, device=device)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> the 4-bit values as int32 [R, C * 8], columns in their natural order."""
    values = packed.unsqueeze(-1) >> _nibble_shifts(packed.device)
    return (values & 0xF).reshape(packed.shape[0], -1)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """4-bit values int [R, C] -> int32 [R, C / 8] (the inverse of unpack_awq)."""
    grouped = values.reshape(values.shape[0], -1, PACK)[..., list(AWQ_PACK_ORDER)].long()
    words = (grouped << torch.arange(0, 32, 4, device=values.device)).sum(-1)  # disjoint bits: sum = or
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_torch(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in ``dtype`` from the packed tensors, in PyTorch ops."""
    q = unpack_awq(qweight)
    z = unpack_awq(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    return (q - z).to(dtype) * s


def _converting_loader(loader: Callable[..., None], convert: Callable[..., torch.Tensor], name: str,
                       source: str) -> Callable[..., None]:
    """``loader`` fed the checkpoint tensor converted to this layout first."""
    def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
        loader(param, convert(name, loaded, source), *shard)
    return load


def _cuda_kernels(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether awq_gemv / awq_dequantize compute x W here: float16 on a GPU, in a CUDA build."""
    from vllm_volta import _custom_ops as ops

    return device.type == "cuda" and dtype == torch.float16 and ops.has_cuda_kernel("awq_gemv")


def kernel_path(device: torch.device, dtype: torch.dtype) -> str:
    """Which code computes x W for layers on ``device`` in ``dtype`` (for the load log)."""
    from vllm_volta.model_executor.layers.quantization import w4_linear

    if w4_linear.kernels_available(device, dtype):
        return (f"{w4_linear.kernel_path_text()}; shapes the layout does not fit: awq_gemv up to "
                f"{GEMV_MAX_ROWS} rows, awq_dequantize + cuBLAS above")
    if _cuda_kernels(device, dtype):
        return f"awq_gemv for steps of up to {GEMV_MAX_ROWS} rows, awq_dequantize + cuBLAS above"
    return f"PyTorch dequantization each call (the CUDA kernels run float16 on a GPU; here {device.type}, {dtype})"


def _int_param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=torch.int32), requires_grad=False)


class AWQLinearMethod:
    """Creates a linear layer's AWQ tensors and computes x W with them (``AWQConfig.get_quant_method``:
    every quantization config makes its layers' method)."""

    def __init__(self, config: AWQConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype | None) -> None:
        g = self.config.group_size
        if input_size % g or output_size % PACK:
            raise ValueError(f"AWQ layer {input_size} -> {output_size} (this rank's part): the input size "
                             f"must be a multiple of the group size {g} and the output size of {PACK}")
        layer.qweight = _int_param(input_size, output_size // PACK)
        layer.qzeros = _int_param(input_size // g, output_size // PACK)
        layer.scales = nn.Parameter(torch.empty(input_size // g, output_size,
                                                dtype=params_dtype or torch.get_default_dtype()),
                                    requires_grad=False)
        convert = None
        if self.config.source != "awq":  # GPTQ tensors: repacked as they load
            from vllm_volta.model_executor.layers.quantization.gptq import gptq_tensor_to_awq as convert
        for name, pack in (("qweight", PACK), ("qzeros", PACK), ("scales", 1)):
            param = getattr(layer, name)
            param.output_dim, param.input_dim, param.pack = 1, 0, pack
            loader = (layer.weight_loader if convert is None else
                      _converting_loader(layer.weight_loader, convert, name, self.config.source))
            param.weight_loader = self._repacking_loader(layer, loader, name)

    def _repacking_loader(self, layer: nn.Module, loader: Callable[..., None], name: str) -> Callable[..., None]:
        """``loader``, then the layer's repacking into the W4A16 kernels' layout once its last
        tensor has loaded (w4_linear.py; a no-op off the GPU)."""
        from vllm_volta.model_executor.layers.quantization import w4_linear

        def repack() -> None:
            w4_linear.repack_layer(layer, layer.qweight, layer.qzeros, layer.scales, self.config.group_size)

        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            loader(param, loaded, *shard)
            w4_linear.note_loaded(layer, name, shard, ("qweight", "qzeros", "scales"), repack)
        return load

    def dense_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """W [K, N] in ``dtype``."""
        return awq_dense_weight(layer.qweight, layer.qzeros, layer.scales, self.config.group_size, dtype,
                                layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] -> x W + bias [..., N]."""
        return awq_matmul(x, layer.qweight, layer.qzeros, layer.scales, self.config.group_size, bias, layer)


def awq_dense_weight(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                     dtype: torch.dtype, layer: nn.Module | None = None) -> torch.Tensor:
    """W [K, N] in ``dtype`` from AWQ-layout tensors (or ``layer``'s repacked weight, once it has
    one): awq_dequantize / w4_dequantize on a GPU, else PyTorch ops."""
    from vllm_volta import _custom_ops as ops
    from vllm_volta.model_executor.layers.quantization.w4_linear import dense_weight_t

    repacked = None if layer is None else layer.__dict__.get("w4_weights")
    if repacked is not None:
        return dense_weight_t(repacked).t().to(dtype)
    if _cuda_kernels(qweight.device, dtype):
        out = torch.empty(qweight.shape[0], scales.shape[1], dtype=dtype, device=qweight.device)
        ops.awq_dequantize(out, qweight, qzeros, scales.to(dtype))
        return out
    return dequantize_torch(qweight, qzeros, scales, group_size, dtype)


def awq_matmul(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int, bias: torch.Tensor | None, layer: nn.Module | None = None) -> torch.Tensor:
    """x [..., K] -> x W + bias [..., N] with W in AWQ's layout (any format repacked to it). With
    ``layer``, on a GPU in float16, the layer's weight moves to the W4A16 kernels' layout at the
    first call and those kernels serve it from then on (w4_linear.py)."""
    from vllm_volta import _custom_ops as ops
    from vllm_volta.model_executor.layers.quantization import w4_linear

    if layer is not None:
        repacked = w4_linear.layer_weights(layer, x, qweight, qzeros, scales, group_size)
        if repacked is not None:
            return w4_linear.w4_matmul(x, repacked, bias)
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] <= GEMV_MAX_ROWS and scales.dtype == torch.float16 and _cuda_kernels(x.device, x.dtype):
        out = torch.empty(rows.shape[0], scales.shape[1], dtype=x.dtype, device=x.device)
        ops.awq_gemv(out, rows.contiguous(), qweight, qzeros, scales)
    else:
        out = rows @ awq_dense_weight(qweight, qzeros, scales, group_size, x.dtype)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out.shape[-1])
