"""Triton W8A8 FP8 GEMM for GPUs with FP8 tensor cores (SM89 and newer).

y = x W^T with W [N, K] float8_e4m3fn and per-(row, K-group) weight scales, x quantized in one
pass to float8_e4m3fn per token and ``group_k``-wide group of inputs (scale = amax / 448), each
K tile's FP8 product accumulated in float32 times both scales. Launch parameters come from
vLLM's tuned-config files (kernel_configs.get_w8a8_block_fp8_config): BLOCK_SIZE_M/N/K,
GROUP_SIZE_M (grouped tile order for L2 reuse), num_warps, num_stages.

Weight scales are held per output row ([N, groups], or [N, 1] for one scale per channel / tensor,
read with a zero group stride), so a tensor-parallel shard or a fused q/k/v row range that cuts a
128-row scale block needs no special case. BLOCK_SIZE_K must divide ``group_k`` so that a K tile
never straddles two scale groups.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_volta.kernel_configs import get_w8a8_block_fp8_config

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_EPS = 1e-10  # all-zero groups get this amax, not a zero scale


@triton.jit
def _quant_group_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, GROUP_K: tl.constexpr,
                        BLOCK: tl.constexpr, FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    cols = group * GROUP_K + offs
    mask = (offs < GROUP_K) & (cols < K)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), EPS) / FP8_MAX
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + group, scale)


def per_token_group_quant_fp8(x: torch.Tensor, group_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (float16 / bfloat16 / float32, CUDA) -> (q [M, K] float8_e4m3fn,
    scales [M, ceil(K / group_k)] float32) with x ~= q * scale per group."""
    m, k = x.shape
    groups = triton.cdiv(k, group_k)
    x = x if x.stride(-1) == 1 else x.contiguous()
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scales = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(group_k)
        _quant_group_kernel[(m, groups)](x, q, scales, k, x.stride(0), q.stride(0), scales.stride(0),
                                         GROUP_K=group_k, BLOCK=block, FP8_MAX=FP8_MAX, EPS=_EPS,
                                         num_warps=4 if block <= 1024 else 8)
    return q, scales


@triton.jit
def _w8a8_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, group_k,
                      stride_am, stride_bn, stride_cm, stride_asm, stride_asg, stride_bsn, stride_bsg,
                      BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                      GROUP_SIZE_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    # grouped order: GROUP_SIZE_M row tiles share each column tile of B while it is in L2
    per_group = GROUP_SIZE_M * num_pid_n
    first_m = (pid // per_group) * GROUP_SIZE_M
    group_rows = min(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm
    bs_ptrs = bs_ptr + offs_n.to(tl.int64) * stride_bsn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_tile in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k0 = k_tile * BLOCK_SIZE_K
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        group = k0 // group_k
        a_s = tl.load(as_ptrs + group * stride_asg, mask=mask_m, other=0.0)
        b_s = tl.load(bs_ptrs + group * stride_bsg, mask=mask_n, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K

    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, c, mask=mask_m[:, None] & mask_n[None, :])


def w8a8_scaled_mm(q: torch.Tensor, q_scales: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor,
                   group_k: int, out_dtype: torch.dtype, config: dict[str, int]) -> torch.Tensor:
    """q [M, K] fp8 with q_scales [M, G]; weight [N, K] fp8 with weight_scales [N, G] or [N, 1]
    (one scale for every group); -> [M, N] in ``out_dtype``. ``config``: the launch params."""
    m, k = q.shape
    n = weight.shape[0]
    if weight.shape[1] != k or weight.stride(1) != 1 or q.stride(1) != 1:
        raise ValueError(f"w8a8_scaled_mm: q {tuple(q.shape)} and weight {tuple(weight.shape)} must share K "
                         "and be contiguous along it")
    if group_k % config["BLOCK_SIZE_K"] and triton.cdiv(k, group_k) > 1:
        raise ValueError(f"BLOCK_SIZE_K={config['BLOCK_SIZE_K']} must divide the scale group {group_k}")
    out = torch.empty(m, n, dtype=out_dtype, device=q.device)
    if m == 0:
        return out
    bs_group_stride = 0 if weight_scales.shape[1] == 1 else weight_scales.stride(1)
    grid = (triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    _w8a8_gemm_kernel[grid](
        q, weight, out, q_scales, weight_scales, m, n, k, group_k,
        q.stride(0), weight.stride(0), out.stride(0), q_scales.stride(0), q_scales.stride(1),
        weight_scales.stride(0), bs_group_stride,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def w8a8_block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor,
                          block_shape: tuple[int, int], config: dict[str, int] | None = None) -> torch.Tensor:
    """x [..., K] -> x W^T [..., N] in x's dtype: x quantized per token and block_shape[1]-wide
    group, then the GEMM with the tuned config for (M, N, K) on this device (``config`` overrides)."""
    rows = x.reshape(-1, x.shape[-1])
    q, q_scales = per_token_group_quant_fp8(rows, block_shape[1])
    n, k = weight.shape
    if config is None:
        config = get_w8a8_block_fp8_config(max(rows.shape[0], 1), n, k, block_shape)
    out = w8a8_scaled_mm(q, q_scales, weight, weight_scales, block_shape[1], x.dtype, config)
    return out.view(*x.shape[:-1], n)
