"""Which matrix product a linear layer runs: the _C gemv kernel for decode-sized inputs.

The elementwise op before a projection can run inside the same kernel (``rms_norm_linear``,
``act_linear``): at decode sizes each of those ops is a launch of its own whose time is
mostly latency.

A decode step multiplies 1 to a few token rows by every weight matrix, so it is bound by
reading the weights. cuBLAS splits such products over K with a second reduction kernel and
reaches a smaller share of the memory bandwidth on the smaller projections; ``gemv`` reads
each weight once with 16-byte loads in one kernel (benchmarks/kernels/benchmark_gemv.py
measures both). Layers use it for float16 inputs of 1 or 2 rows on CUDA (Volta and newer);
every other case, and every case with VLLM_VOLTA_DECODE_GEMV=0, goes to F.linear.

Measured on an H200 (Llama-3-8B projections, one decoder layer's four GEMVs, CUDA graphs):
1 row 106 us vs cuBLAS 121 us, 2 rows 109 vs 114, 4 rows 146 vs 115. So 2 rows is the
limit here, although the kernel takes up to 4.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_volta.logger import init_logger

if TYPE_CHECKING:
    from vllm_volta.model_executor.layers.layernorm import RMSNorm
    from vllm_volta.model_executor.layers.linear import LinearBase

logger = init_logger(__name__)

GEMV_MAX_ROWS = 2  # where it beats cuBLAS (the kernel itself takes up to kGemvMaxRows = 4)
_announced = False


def gemv_enabled() -> bool:
    """Whether layers built now may use gemv: switched on, and a CUDA gemv kernel exists."""
    from vllm_volta import envs
    if not envs.VLLM_VOLTA_DECODE_GEMV:
        return False
    try:
        from vllm_volta._custom_ops import has_cuda_kernel
    except ImportError:
        return False
    return has_cuda_kernel("gemv")


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """gemv's contract: float16 CUDA rows, 1 to 4 of them, 16-byte aligned vectors."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= GEMV_MAX_ROWS and x.is_cuda and x.dtype == torch.float16
            and weight.dtype == torch.float16 and x.shape[1] % 8 == 0 and x.stride(1) == 1
            and (x.shape[0] == 1 or x.stride(0) % 8 == 0) and x.data_ptr() % 16 == 0
            and weight.is_contiguous() and weight.data_ptr() % 16 == 0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, use_gemv: bool) -> torch.Tensor:
    """x W^T + b, through gemv when `use_gemv` and the input fits it, else F.linear."""
    if use_gemv and gemv_applies(x, weight):
        global _announced
        if not _announced:
            _announced = True
            logger.info("Linear layers: gemv kernel for 1-%d float16 token rows (decode), cuBLAS "
                        "for larger inputs", GEMV_MAX_ROWS)
        from vllm_volta import _custom_ops as ops
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        ops.gemv(out, x, weight, bias)
        return out
    return F.linear(x, weight, bias)


def _fuses(x: torch.Tensor, layer: LinearBase, *extra: torch.Tensor | None) -> bool:
    """Whether `layer`'s product of `x` (and the prologue's other tensors) runs as a fused gemv."""
    return (layer.use_gemv and layer.tp_size == 1 and gemv_applies(x, layer.weight) and x.is_contiguous()
            and all(t is None or (t.is_contiguous() and t.dtype == torch.float16 and t.data_ptr() % 16 == 0)
                    for t in extra))


def rms_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm,
                    layer: LinearBase) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer(norm(x + residual)), x + residual); without a residual, (layer(norm(x)), x).

    One rms_norm_gemv kernel when the product is a decode GEMV, else the norm then the layer.
    """
    if _fuses(x, layer, residual, norm.weight):
        from vllm_volta import _custom_ops as ops
        out = torch.empty(x.shape[0], layer.weight.shape[0], dtype=x.dtype, device=x.device)
        residual_out = None if residual is None else torch.empty_like(x)
        ops.rms_norm_gemv(out, x, residual, residual_out, norm.weight, norm.variance_epsilon, layer.weight,
                          layer.bias)
        return out, x if residual is None else residual_out
    if residual is None:
        return layer(norm(x)), x
    x, residual = norm(x, residual)
    return layer(x), residual


def act_linear(x: torch.Tensor, act_fn: torch.nn.Module, layer: LinearBase) -> torch.Tensor:
    """layer(act_fn(x)) for a gated activation; one silu_and_mul_gemv kernel when it applies."""
    from vllm_volta.model_executor.layers.activation import SiluAndMul
    if isinstance(act_fn, SiluAndMul) and _fuses(x, layer):
        from vllm_volta import _custom_ops as ops
        out = torch.empty(x.shape[0], layer.weight.shape[0], dtype=x.dtype, device=x.device)
        ops.silu_and_mul_gemv(out, x, layer.weight, layer.bias)
        return out
    return layer(act_fn(x))
