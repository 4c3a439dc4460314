"""The experts of a mixture-of-experts layer on the GPU, without a host sync (CUDA-graph capturable).

Given each token's experts (int32 ids [T, k]) and routing weights (float32 [T, k]), two paths:

- ``gemv`` (decode, a few tokens): ``moe_gemv_silu_and_mul`` (``moe_gemv_gelu_tanh_and_mul``) reads
  the chosen experts' gate and up rows once per (token, expert) pair and applies the gated
  activation; ``moe_gemv_down_sum`` reads their down rows, weights each product and sums a token's
  k of them, in FP32. Two launches, no intermediate but [T, k, I]. float16 / float32 (bfloat16
  on SM80+).
- ``gemm`` (prefill, larger batches; 16-bit dtypes): vLLM's fused-MoE design: the pairs sorted
  by expert and padded per expert to ``block_size`` (``moe_align_block_size``), then the
  tensor-core ``moe_grouped_gemm`` (WMMA, FP32 accumulation) for gate_up, ``silu_and_mul`` (or
  ``gelu_tanh_and_mul``), the grouped GEMM for down with the routing weight applied, and
  ``moe_sum`` over each token's k rows.
  Every used expert's weights are read once per block of ``block_size`` pairs.

With expert parallelism the weights hold this rank's experts only and ``expert_map`` (int32 [E],
-1 for experts on other ranks) turns the global ids into local ones: the grouped GEMM's expert
ordering leaves the -1 pairs out and their rows of the [T, k, H] products stay zero; the GEMVs
(which read one expert per pair) see those pairs as local expert 0 with weight 0, so they add
nothing; those reads of expert 0's rows are why the MoE layer sends 16-bit decode batches to the
grouped GEMM under expert parallelism (``expert_parallel_config``).

A third choice, ``host``, leaves a batch to the layer's host-grouped cuBLAS loop (eager steps
only: inside a CUDA-graph capture the device path runs instead). Which path, ``rows_per_block``
and ``block_size`` at a token count come from a tuned kernel config (op ``fused_moe``, keyed by the layer's shape, dtype and device:
benchmarks/kernels/benchmark_moe.py --tune writes them), else the defaults below.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.moe_routing import align_block_size

DECODE_MAX_TOKENS = 8  # default: the gemv path up to here (each pair re-reads its expert's rows)
PATHS = ("gemv", "gemm", "host")
BLOCK_SIZES = (16, 32, 64)
ROWS_PER_BLOCK = (0, 2, 4, 8)
# HF hidden_act -> the activation the kernels apply (SiLU, or GELU's tanh approximation).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def default_config(tokens: int, num_experts: int, top_k: int, dtype: torch.dtype) -> dict[str, Any]:
    """Launch parameters before tuning: gemv for decode sizes; float32 batches (no tensor-core
    path) on the host-grouped cuBLAS loop; else grouped GEMM blocks that the average expert fills
    (16 rows while experts get few pairs)."""
    if tokens <= DECODE_MAX_TOKENS:
        return {"path": "gemv", "rows_per_block": 0}
    if dtype == torch.float32:
        return {"path": "host"}
    per_expert = tokens * top_k / num_experts
    return {"path": "gemm", "block_size": 16 if per_expert < 16 else 32 if per_expert < 64 else 64}


def capturable_config(config: dict[str, Any], tokens: int, num_experts: int, top_k: int,
                      dtype: torch.dtype) -> dict[str, Any]:
    """``config``, or where it names the host path (a host sync per call, which a CUDA graph
    cannot hold) the device path for the capture: GEMVs for float32, else the grouped GEMM."""
    if config["path"] != "host":
        return config
    if dtype == torch.float32:
        return {"path": "gemv", "rows_per_block": 0}
    return default_config(max(tokens, DECODE_MAX_TOKENS + 1), num_experts, top_k, dtype)


def expert_parallel_config(config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """``config`` for a layer holding only this rank's experts: the GEMVs read one expert per
    pair, so every pair of another rank's expert would re-read local expert 0's rows (most pairs,
    with many ranks); the grouped GEMM leaves those pairs out and reads each used local expert
    once. 16-bit GEMV batches therefore take the grouped GEMM (16-row blocks); float32 (no
    tensor-core path) keeps the GEMVs."""
    if config["path"] == "gemv" and dtype != torch.float32:
        return {"path": "gemm", "block_size": BLOCK_SIZES[0]}
    return config


def check_config(config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """A tuned entry's parameters, validated (bad files are clear errors, not wrong launches)."""
    path = config.get("path")
    if path not in PATHS:
        raise ValueError(f"fused_moe config: 'path' must be one of {PATHS}, got {path!r}")
    if path == "gemm" and dtype == torch.float32:
        raise ValueError("fused_moe config: 'path' 'gemm' needs float16 or bfloat16 weights")
    if path == "gemm" and config.get("block_size") not in BLOCK_SIZES:
        raise ValueError(f"fused_moe config: 'block_size' must be one of {BLOCK_SIZES}, got "
                         f"{config.get('block_size')!r}")
    if path == "gemv" and config.get("rows_per_block", 0) not in ROWS_PER_BLOCK:
        raise ValueError(f"fused_moe config: 'rows_per_block' must be one of {ROWS_PER_BLOCK}, got "
                         f"{config.get('rows_per_block')!r}")
    return config


def unsupported_reason(w13: torch.Tensor, w2: torch.Tensor, top_k: int, hidden_act: str) -> str | None:
    """Why these experts cannot run on the device path, or None when they can."""
    if not w13.is_cuda:
        return "the weights are not on a CUDA device"
    if not ops.has_cuda_kernel("moe_gemv_silu_and_mul"):
        return "this build has no CUDA mixture-of-experts kernels"
    if hidden_act not in ACTIVATIONS:
        return f"hidden_act {hidden_act!r} (the fused kernels apply one of {sorted(ACTIVATIONS)})"
    if w13.dtype == torch.bfloat16:
        if not ops.cuda_bf16_kernels_built() or torch.cuda.get_device_capability(w13.device) < (8, 0):
            return "bfloat16 kernels need an SM80+ GPU and build"
    elif w13.dtype not in (torch.float16, torch.float32):
        return f"dtype {w13.dtype}"
    vec = 16 // w13.element_size()
    hidden, inter = w13.shape[2], w2.shape[2]
    if hidden % 8 or inter % 8 or hidden < vec or inter < vec:
        return f"hidden ({hidden}) and intermediate ({inter}) sizes must be multiples of 8"
    if w13.shape[0] > 1024 or top_k > 32:
        return "more than 1024 experts or top_k above 32"
    if not (w13.is_contiguous() and w2.is_contiguous()):
        return "the stacked weights are not contiguous"
    return None


def local_ids(ids: torch.Tensor, expert_map: torch.Tensor) -> torch.Tensor:
    """Global expert ids [T, k] -> this rank's local ids (int32; -1 where another rank holds it)."""
    return expert_map[ids.long()]


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor, config: dict[str, Any], activation: str = "silu",
                  expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """sum_j weights[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = ids[t, j]: [T, H] in x's dtype.
    ``activation``: "silu" or "gelu_tanh" (values of ACTIVATIONS). With ``expert_map`` (expert
    parallelism) ``ids`` are global, the weights hold the local experts, and the sum runs over the
    pairs whose expert is local."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    if config["path"] not in ("gemv", "gemm"):
        raise ValueError(f"fused_experts runs the 'gemv' or 'gemm' path, got {config['path']!r}")
    tokens, top_k = ids.shape
    x = x.contiguous()
    if x.data_ptr() % 16:  # the kernels read 16-byte vectors (an offset view, rare)
        x = x.clone()
    out = torch.empty_like(x)
    if tokens == 0:
        return out
    inter = w2.shape[2]
    if expert_map is not None:
        ids = local_ids(ids, expert_map)
    if config["path"] == "gemv":
        if expert_map is not None:  # every pair reads some expert: other ranks' pairs weigh 0
            elsewhere = ids < 0
            ids = ids.masked_fill(elsewhere, 0)
            weights = weights.masked_fill(elsewhere, 0.0)
        rows = int(config.get("rows_per_block", 0))
        act = torch.empty(tokens, top_k, inter, dtype=x.dtype, device=x.device)
        getattr(ops, f"moe_gemv_{activation}_and_mul")(act, x, w13, ids, rows)
        ops.moe_gemv_down_sum(out, act, w2, ids, weights, rows)
        return out
    block = int(config["block_size"])
    sorted_ids, experts_ids, total = align_block_size(ids, w13.shape[0], block)
    pairs = tokens * top_k
    gate_up = torch.empty(pairs, 2 * inter, dtype=x.dtype, device=x.device)
    ops.moe_grouped_gemm(gate_up, x, w13, sorted_ids, experts_ids, total, None, top_k, block)
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    getattr(ops, f"{activation}_and_mul")(act, gate_up)
    # Pairs left out of the ordering (other ranks' experts) are never written: zeros for moe_sum.
    alloc = torch.empty if expert_map is None else torch.zeros
    down = alloc(tokens, top_k, x.shape[1], dtype=x.dtype, device=x.device)
    ops.moe_grouped_gemm(down.view(pairs, -1), act, w2, sorted_ids, experts_ids, total, weights, 1, block)
    ops.moe_sum(down, out)
    return out
