"""Quantized experts (4-bit, FP8) on the GPU, without a host sync (CUDA-graph capturable).

Three paths by (token, expert) pair count, float16 activations, each picked where it moves the
fewest bytes (P: one expert's packed bytes; the all-experts path moves about 9 E P: packed read,
float16 written, float16 read by the GEMM):

- ``w4 gemv`` (4-bit, up to W4_GEMV_PAIRS_PER_EXPERT pairs per local expert, about T k P bytes:
  decode and medium batches): ``moe_w4_gemv_act_and_mul`` reads each
  (token, expert) pair's gate and up rows in the K-major 4-bit layout (16-byte loads along K,
  dequantized in registers) and applies the gated activation; ``moe_w4_gemv_down_sum`` reads the
  down rows and sums a token's k weighted products in FP32. Only the chosen experts are read.
- ``gather`` (FP8, at most one pair per local expert and CHUNK_BYTES of scratch): the chosen
  expert of each pair is dequantized into a scratch [T k, N, K] (PyTorch ops; ``moe_w4_dequantize``
  for 4-bit), then the float16 expert GEMVs (fused_moe.py) run with pair p reading scratch expert p.
- ``chunks`` (prefill, larger batches): every local expert is dequantized, CHUNK_BYTES of float16
  weights at a time, and the float16 grouped GEMM runs over the pairs of that chunk's experts
  (the others masked out as expert parallelism masks other ranks' experts); the chunks' outputs
  are summed.
Every launch's shape follows the token count alone, so decode steps replay in CUDA graphs.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta import _custom_ops as ops
from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers import fused_moe

logger = init_logger(__name__)

W4_GEMV_PAIRS_PER_EXPERT = 8  # each pair re-reads its expert's packed rows: ~T k P bytes against ~9 E P
CHUNK_BYTES = 256 << 20  # float16 scratch of the gathered and all-experts paths
ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1}


def unsupported_reason(layer: nn.Module) -> str | None:
    """Why ``layer``'s quantized experts cannot run on this GPU path, or None when they can."""
    method = layer.quant_method
    first = getattr(layer, method.param_names()[0])
    if not first.is_cuda:
        return "the weights are not on a CUDA device"
    if layer.hidden_act not in fused_moe.ACTIVATIONS:
        return f"hidden_act {layer.hidden_act!r} (the fused kernels apply one of {sorted(fused_moe.ACTIVATIONS)})"
    if layer.act_dtype != torch.float16:
        return f"quantized experts run float16 activations on the GPU path, the model runs {layer.act_dtype}"
    needed = "moe_w4_gemv_act_and_mul" if method.kind == "w4" else "moe_gemv_silu_and_mul"
    try:
        built = ops.has_cuda_kernel(needed) and ops.has_cuda_kernel("moe_grouped_gemm")
    except RuntimeError:  # an extension built before the op existed
        built = False
    if not built:
        return f"this build has no CUDA kernel {needed}"
    hidden, inter = layer.w2_sz.shape[1] if method.kind == "w4" else layer.w2_weight.shape[1], layer.intermediate
    if hidden % 32 or inter % 32:
        return f"hidden ({hidden}) and intermediate ({inter}) sizes must be multiples of 32"
    if layer.num_local_experts > 1024 or layer.top_k > 32:
        return "more than 1024 experts or top_k above 32"
    return None


def _local(layer: nn.Module, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Local expert ids (other ranks' pairs: expert 0 with weight 0, so they add nothing)."""
    if layer.expert_map is None:
        return ids, weights
    ids = fused_moe.local_ids(ids, layer.expert_map)
    elsewhere = ids < 0
    return ids.masked_fill(elsewhere, 0), weights.masked_fill(elsewhere, 0.0)


def _gathered(layer: nn.Module, experts: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13, w2) in ``dtype`` (float16 on this path) of local ``experts`` (int32 [n]), one copy per entry."""
    if layer.quant_method.kind == "fp8":
        return layer.quant_method.gathered_weights(layer, experts.long(), dtype)
    n, inter, hidden = experts.numel(), layer.intermediate, layer.w13_qweight.shape[2] * 8
    w13 = torch.empty(n, 2 * inter, hidden, dtype=dtype, device=experts.device)
    w2 = torch.empty(n, hidden, inter, dtype=dtype, device=experts.device)
    ops.moe_w4_dequantize(w13, layer.w13_qweight, layer.w13_sz, experts)
    ops.moe_w4_dequantize(w2, layer.w2_qweight, layer.w2_sz, experts)
    return w13, w2


def quantized_experts(layer: nn.Module, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The layer's experts on ``x`` [T, H] float16 with routing ``ids`` / ``weights`` [T, k]: [T, H]."""
    tokens, top_k = ids.shape
    activation = fused_moe.ACTIVATIONS[layer.hidden_act]
    x = x.contiguous()
    if x.data_ptr() % 16:  # the kernels read 16-byte vectors
        x = x.clone()
    kind = layer.quant_method.kind
    if tokens == 0:
        return torch.empty_like(x)
    pairs, experts = tokens * top_k, layer.num_local_experts
    if kind == "w4" and pairs <= W4_GEMV_PAIRS_PER_EXPERT * experts:
        info_once(logger, "MoE 4-bit experts on the device: moe_w4 GEMVs up to %d (token, expert) pairs (only "
                  "the chosen experts' packed rows), dequantized chunks + grouped GEMM above",
                  W4_GEMV_PAIRS_PER_EXPERT * experts)
        ids, weights = _local(layer, ids, weights)
        act = torch.empty(tokens, top_k, layer.intermediate, dtype=x.dtype, device=x.device)
        ops.moe_w4_gemv_act_and_mul(act, x, layer.w13_qweight, layer.w13_sz, ids, ACTIVATION_CODES[activation])
        out = torch.empty_like(x)
        ops.moe_w4_gemv_down_sum(out, act, layer.w2_qweight, layer.w2_sz, ids, weights)
        return out
    expert_bytes = 3 * layer.intermediate * x.shape[1] * x.element_size()
    if pairs <= experts and pairs * expert_bytes <= CHUNK_BYTES:
        info_once(logger, "MoE %s experts on the device: the chosen experts dequantized per pair, float16 "
                  "expert GEMVs (up to %d pairs)", kind, min(experts, CHUNK_BYTES // expert_bytes))
        ids, weights = _local(layer, ids, weights)
        w13, w2 = _gathered(layer, ids.flatten(), x.dtype)
        pair_ids = torch.arange(tokens * top_k, dtype=torch.int32, device=x.device).view(tokens, top_k)
        return fused_moe.fused_experts(x, w13, w2, weights, pair_ids, {"path": "gemv", "rows_per_block": 0},
                                       activation)
    return _chunked(layer, x, ids, weights, activation)


def _chunked(layer: nn.Module, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
             activation: str) -> torch.Tensor:
    """Every local expert dequantized a chunk at a time; the grouped GEMM over each chunk's pairs."""
    experts, inter, hidden = layer.num_local_experts, layer.intermediate, x.shape[1]
    per_chunk = max(1, min(experts, CHUNK_BYTES // (3 * inter * hidden * 2)))
    info_once(logger, "MoE quantized experts above decode sizes: dequantized %d experts at a time, float16 "
              "grouped GEMM", per_chunk)
    config = fused_moe.default_config(max(x.shape[0], fused_moe.DECODE_MAX_TOKENS + 1), experts,
                                      layer.top_k, torch.float16)
    local = ids if layer.expert_map is None else fused_moe.local_ids(ids, layer.expert_map)
    out = None
    for start in range(0, experts, per_chunk):
        count = min(per_chunk, experts - start)
        chunk = torch.arange(start, start + count, dtype=torch.int32, device=x.device)
        w13, w2 = _gathered(layer, chunk, x.dtype)
        # global id -> index in this chunk, -1 elsewhere (the grouped GEMM leaves those pairs out)
        shifted = local.long() - start
        chunk_map_ids = torch.where((shifted >= 0) & (shifted < count), shifted, -1).to(torch.int32)
        part = fused_moe.fused_experts(x, w13, w2, weights, chunk_map_ids, config, activation,
                                       expert_map=_IDENTITY.get(count, x.device))
        out = part if out is None else out.add_(part)
    return out


class _IdentityMaps:
    """Cached identity maps [n] -> [n] (ids already local: fused_experts still masks -1 pairs)."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, torch.device], torch.Tensor] = {}

    def get(self, n: int, device: torch.device) -> torch.Tensor:
        key = (n, device)
        if key not in self._maps:
            # index n (after -1 wraps to the last entry) maps to -1: an extra entry past the end
            m = torch.arange(n + 1, dtype=torch.int32, device=device)
            m[n] = -1
            self._maps[key] = m
        return self._maps[key]


_IDENTITY = _IdentityMaps()
