"""FP8 weights kept in FP8 on GPUs without FP8 tensor cores (V100, T4, A100): W8A16 CUDA kernels.

The weight stays float8_e4m3fn [N, K] in GPU memory (a Qwen3-8B-FP8 fits a 16 GB V100) and the
kernels (csrc/fp8_kernels.cu) convert it to float16 in registers with integer operations, so
they run on SM70 and newer; the activations stay float16 (bfloat16 on SM80+), not quantized:
- up to ``GEMV_MAX_ROWS`` input rows (decode): ``fp8_gemv`` reads each weight byte once, FP32
  accumulation, the scales applied per 16-weight vector's group;
- up to ``GEMM_MAX_ROWS``: ``fp8_gemm`` on tensor cores (WMMA, 16-bit MMAs with FP32
  accumulation), the weight tiles converted and scaled on their way into shared memory;
- more rows: ``fp8_dequantize`` writes the 16-bit weight into a scratch tensor from the caching
  allocator (reused call after call), then one cuBLAS GEMM, whose efficiency at these sizes
  outweighs reading the weight again at two bytes a value.
Scales are fp8.py's [N, G] float32 rows (G = ceil(K / group_k), or 1 per channel / tensor).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

GEMV_MAX_ROWS = 8  # fp8_gemv's rows
GEMM_MAX_ROWS = 128  # fp8_gemm up to here, then fp8_dequantize + cuBLAS (benchmark_fp8_gemv.py times both)
_VECTOR = 16  # weights per 16-byte load: K and the scale groups must be whole vectors
PATH_NAME = "FP8 weights kept in memory, converted in registers (SM70 kernels)"


def sm70_kernels_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when fp8_gemv / fp8_gemm / fp8_dequantize can serve layers on ``device`` in ``dtype``, else
    why not."""
    if device.type != "cuda":
        return f"the FP8 CUDA kernels need a CUDA GPU (here {device.type})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"the FP8 CUDA kernels compute in float16 or bfloat16 (here {str(dtype).removeprefix('torch.')})"
    from vllm_volta import _custom_ops as ops

    try:
        built = ops.has_cuda_kernel("fp8_gemm")
    except RuntimeError:  # an extension built before the ops existed
        return "this build of vllm_volta._C predates the FP8 kernels (rebuild it)"
    if not built:
        return "this build of vllm_volta._C has no CUDA kernels"
    if dtype == torch.bfloat16:
        from vllm_volta.platforms import current_platform

        if not current_platform.has_device_capability(80, device.index or 0):
            return "bfloat16 needs SM80+ (run --dtype half)"
        if not ops.cuda_bf16_kernels_built():
            return "this build has no bfloat16 kernels (no SM80+ target arch)"
    return None


def layer_fits(input_size: int, group_k: int, groups: int) -> bool:
    """Whether a layer's shape suits the kernels: K and the scale groups in whole 16-weight vectors."""
    return input_size % _VECTOR == 0 and (groups == 1 or group_k % _VECTOR == 0)


def describe() -> str:
    return (f"{PATH_NAME}: fp8_gemv for steps of up to {GEMV_MAX_ROWS} rows, the fp8_gemm tensor-core GEMM up to "
            f"{GEMM_MAX_ROWS}, fp8_dequantize + cuBLAS above")


def fp8_w8a16_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_k: int,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] (float16 / bfloat16) -> x W^T + bias [..., N] in x's dtype, W = weight [N, K] fp8 x
    scales [N, G]."""
    from vllm_volta import _custom_ops as ops

    n, k = weight.shape
    rows = x.reshape(-1, k)
    # The kernels read whole 16-byte vectors of each row.
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) % 8) or rows.data_ptr() % 16:
        rows = rows.clone(memory_format=torch.contiguous_format)  # a fresh, aligned copy
    group = group_k if scales.shape[1] > 1 else _VECTOR  # one scale per row: the group is unused
    if rows.shape[0] == 0:
        out = rows.new_empty(0, n)
    elif rows.shape[0] <= GEMM_MAX_ROWS:
        out = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
        kernel = ops.fp8_gemv if rows.shape[0] <= GEMV_MAX_ROWS else ops.fp8_gemm
        kernel(out, rows, weight, scales, group, bias)
    else:
        dense = torch.empty(n, k, dtype=x.dtype, device=x.device)
        ops.fp8_dequantize(dense, weight, scales, group)
        out = F.linear(rows, dense, bias)
    return out.view(*x.shape[:-1], n)
