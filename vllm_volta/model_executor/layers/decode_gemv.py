"""Which matrix product a linear layer runs: the _C gemv kernel for decode-sized inputs.

A decode step multiplies 1 to a few token rows by every weight matrix, so it is bound by
reading the weights. cuBLAS splits such products over K with a second reduction kernel and
reaches a smaller share of the memory bandwidth on the smaller projections; ``gemv`` reads
each weight once with 16-byte loads in one kernel (benchmarks/kernels/benchmark_gemv.py
measures both). Layers use it for float16 inputs of 1 or 2 rows on CUDA (Volta and newer);
every other case, and every case with VLLM_VOLTA_DECODE_GEMV=0, goes to F.linear.

Two epilogues remove a kernel (or, with the V100 adapter, several ATen kernels) per use:
``gemv_silu_and_mul`` also applies an MLP's gated activation (``silu_and_mul_linear``), and
``gemv_add`` adds a projection into the residual stream (``add_linear_``; at larger sizes the
GEMM accumulates into the residual itself). A decoder layer's pre-norms then read the residual
stream alone. At gemv sizes they become a prologue of the projection they feed (``norm=`` of
``linear`` and ``silu_and_mul_linear``): gemv RMS-normalizes its input rows in the same pass (in
FP32, without rms_norm's rounding of the normalized row to float16), and no norm kernel runs at
all; at larger sizes they are plain rms_norm ops. An attention layer's qkv projection also takes
over RoPE and the KV-cache write (``rope_cache_linear``, the ``gemv_rope_cache`` kernel: what
rotary_embedding_and_cache would do next, with the same roundings).

Measured on an H200 (Llama-3-8B projections, one decoder layer's four GEMVs, CUDA graphs):
1 row 106 us vs cuBLAS 121 us, 2 rows 109 vs 114, 4 rows 146 vs 115. So 2 rows is the
limit here, although the kernel takes up to 4.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from vllm_volta import _custom_ops as ops
from vllm_volta.logger import info_once, init_logger

if TYPE_CHECKING:
    from vllm_volta.model_executor.layers.layernorm import RMSNorm

logger = init_logger(__name__)

GEMV_MAX_ROWS = 2  # where it beats cuBLAS (the kernel itself takes up to kGemvMaxRows = 4)


def gemv_enabled() -> bool:
    """Whether layers built now may use gemv: switched on, and a CUDA gemv kernel exists."""
    from vllm_volta import envs
    if not envs.VLLM_VOLTA_DECODE_GEMV:
        return False
    if not ops.has_cuda_kernel("gemv"):
        return False
    info_once(logger, "Linear layers: gemv kernel for 1-%d float16 token rows on CUDA (decode), "
              "cuBLAS for larger inputs", GEMV_MAX_ROWS)
    return True


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """gemv's contract (float16 CUDA rows, 16-byte aligned vectors), for 1 to GEMV_MAX_ROWS rows."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= GEMV_MAX_ROWS and x.is_cuda and x.dtype == torch.float16
            and weight.dtype == torch.float16 and x.shape[1] % 8 == 0 and x.stride(1) == 1
            and (x.shape[0] == 1 or x.stride(0) % 8 == 0) and x.data_ptr() % 16 == 0
            and weight.is_contiguous() and weight.data_ptr() % 16 == 0)


def _gemv_args(x: torch.Tensor, weight: torch.Tensor, use_gemv: bool, norm: RMSNorm | None
               ) -> dict[str, Any] | None:
    """gemv's extra arguments (`norm` as its prologue: norm_weight, epsilon) when gemv runs this
    product, else None: gemv is off or does not fit, or the norm's weight does not fit it (then
    the norm runs as its own op)."""
    if not (use_gemv and gemv_applies(x, weight)):
        return None
    if norm is None:
        return {}
    w = norm.weight
    if not (w.dtype == torch.float16 and w.shape == (x.shape[1],) and w.is_contiguous()
            and w.data_ptr() % 16 == 0):
        return None
    return {"norm_weight": w, "epsilon": norm.variance_epsilon}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, use_gemv: bool,
           norm: RMSNorm | None = None) -> torch.Tensor:
    """norm(x) W^T + b (x W^T + b without `norm`), through gemv when `use_gemv` and the input fits
    it, else the norm op and F.linear."""
    if (args := _gemv_args(x, weight, use_gemv, norm)) is not None:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        ops.gemv(out, x, weight, bias, **args)
        return out
    return F.linear(x if norm is None else norm(x), weight, bias)


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, use_gemv: bool,
                        act_fn: Callable[[torch.Tensor], torch.Tensor], norm: RMSNorm | None = None
                        ) -> torch.Tensor:
    """silu(x W_gate^T) * (x W_up^T) for weight = [W_gate; W_up] (x = norm(x) with `norm`): one
    gemv_silu_and_mul launch when `use_gemv` and the input fits gemv, else the norm op, the
    product and ``act_fn`` (silu_and_mul)."""
    if (args := _gemv_args(x, weight, use_gemv, norm)) is not None:
        out = torch.empty(x.shape[0], weight.shape[0] // 2, dtype=x.dtype, device=x.device)
        ops.gemv_silu_and_mul(out, x, weight, bias, **args)
        return out
    x = x if norm is None else norm(x)
    if x.is_cuda and _adapter_build():
        return split_silu_and_mul_linear(x, weight, bias)
    return act_fn(F.linear(x, weight, bias))


def split_silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """silu(x W_gate^T) * (x W_up^T) as two GEMMs into separate tensors, then ATen's silu and
    mul over contiguous rows. For the V100 adapter, whose silu_and_mul reads the strided
    halves of one [T, 2d] product (ATen's non-vectorized path). The activation is rounded to
    the input dtype before the product, as in silu_and_mul."""
    d = weight.shape[0] // 2
    gate = F.linear(x, weight[:d], None if bias is None else bias[:d])
    up = F.linear(x, weight[d:], None if bias is None else bias[d:])
    return F.silu(gate, inplace=True).mul_(up)


@functools.cache
def _adapter_build() -> bool:
    """ops.v100_adapter_build(), asked once (this runs per MLP call), logging the choice."""
    adapter = ops.v100_adapter_build()
    if adapter:
        logger.info("V100 adapter build: gate/up projections as two GEMMs, so the gated activation "
                    "reads contiguous rows")
    return adapter


def rope_cache_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, use_gemv: bool,
                      norm: RMSNorm | None, rotary_emb: Any, positions: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> torch.Tensor | None:
    """q | k | v = norm(x) W^T + b with RoPE on q and k and k, v written to ``kv_cache`` at
    ``slot_mapping``, in one gemv_rope_cache launch; None, with nothing done, when that kernel
    does not apply (gemv does not, partial rotation, another cache dtype or layout): then the
    caller projects and the attention layer rotates and writes."""
    args = _gemv_args(x, weight, use_gemv, norm)
    if args is None:
        return None
    table, rows = rotary_emb.cos_sin_cache, x.shape[0]
    if not (rotary_emb.rotary_dim == rotary_emb.head_size == kv_cache.shape[-1] and kv_cache.dim() == 5
            and kv_cache.dtype == torch.float16 and kv_cache.is_contiguous()
            and table.dtype in (torch.float32, torch.float16) and table.device == x.device and table.stride(-1) == 1
            and all(t.dtype == torch.int64 and t.shape == (rows,) and t.is_contiguous()
                    for t in (positions, slot_mapping))):
        return None
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    ops.gemv_rope_cache(out, x, weight, bias, positions, kv_cache, slot_mapping, table, rotary_emb.is_neox_style,
                        **args)
    return out


def add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                use_gemv: bool) -> bool:
    """``residual += x W^T + b`` in one kernel: gemv_add when `use_gemv` and the inputs fit gemv,
    else, without a bias, the GEMM adds its product into the residual itself (``addmm_``: beta = 1,
    one rounding of product + residual). Then the next norm reads the residual alone: a plain
    rms_norm instead of fused_add_rms_norm, which with the V100 adapter is four ATen kernels.
    Returns False, with nothing done, unless x is [rows, K] and the residual a contiguous [rows, N]
    of x's dtype; also for a biased product too large for gemv."""
    if not (x.dim() == 2 and residual.shape == (x.shape[0], weight.shape[0])
            and residual.dtype == x.dtype == weight.dtype and residual.is_contiguous()):
        return False
    if use_gemv and gemv_applies(x, weight):
        ops.gemv_add(residual, x, weight, bias)
        return True
    if bias is not None:
        return False
    residual.addmm_(x, weight.t())
    return True
