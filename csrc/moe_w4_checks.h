// Argument validation of the 4-bit mixture-of-experts ops (decode GEMVs and the expert
// dequantization), shared by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

struct MoeW4Args {
  int64_t tokens;
  int64_t top_k;
  int64_t experts;
  int64_t n;             // output features per (token, expert) pair (I for w13, H for w2)
  int64_t k;             // input features
  int64_t group_chunks;  // 32-value chunks per group
};

// The stacked 4-bit weights: qweight int32 [E, R, K / 8] (K-major), sz float16 [E, R, G, 2]
// (scale, zero point), K a multiple of 32 and of the group size K / G, groups whole chunks.
inline MoeW4Args check_moe_w4_weight(const char* op, const Tensor& qweight, const Tensor& sz) {
  VLLM_VOLTA_CHECK(qweight.scalar_type() == ScalarType::Int && qweight.dim() == 3, op,
                  ": 'qweight' must be int32 [num_experts, out_features, in_features / 8]");
  VLLM_VOLTA_CHECK(sz.scalar_type() == ScalarType::Half && sz.dim() == 4 && sz.size(3) == 2, op,
                  ": 'sz' must be float16 [num_experts, out_features, groups, 2]");
  check_contiguous(op, "qweight", qweight);
  check_contiguous(op, "sz", sz);
  check_same_device(op, "sz", sz, qweight, "qweight");
  const int64_t experts = qweight.size(0), rows = qweight.size(1), k = qweight.size(2) * 8;
  VLLM_VOLTA_CHECK(sz.size(0) == experts && sz.size(1) == rows, op, ": 'sz' must be [", experts, ", ", rows,
                  ", groups, 2] like 'qweight'");
  const int64_t groups = sz.size(2), chunks = k / 32;
  VLLM_VOLTA_CHECK(k >= 32 && k % 32 == 0, op, ": in_features must be a positive multiple of 32, got ", k);
  VLLM_VOLTA_CHECK(groups >= 1 && chunks % groups == 0, op, ": the group size (in_features / groups = ", k, " / ",
                  groups, ") must be a multiple of 32 dividing in_features");
  VLLM_VOLTA_CHECK(experts >= 1 && rows >= 1 && experts * rows < (int64_t{1} << 31), op,
                  ": 'qweight' must have between 1 and 2^31 rows in all");
  return {0, 0, experts, rows, k, chunks / groups};
}

// moe_w4_gemv_act_and_mul: out [T, k, I] = act(x W13_e[:I]^T) * (x W13_e[I:]^T), input [T, H].
// moe_w4_gemv_down_sum: out [T, H] = sum_j topk_weights[t, j] * input[t, j] W2_e^T, input [T, k, I].
// input / out float16 contiguous; topk_ids int32 [T, k]; topk_weights float32 [T, k].
inline MoeW4Args check_moe_w4_gemv_args(const char* op, const Tensor& out, const Tensor& input, const Tensor& qweight,
                                        const Tensor& sz, const Tensor& topk_ids,
                                        const std::optional<Tensor>& topk_weights, bool gated) {
  MoeW4Args a = check_moe_w4_weight(op, qweight, sz);
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half, op, ": 'input' must be float16");
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half, op, ": 'out' must be float16");
  check_contiguous(op, "input", input);
  check_contiguous(op, "out", out);
  check_same_device(op, "input", input, qweight, "qweight");
  check_same_device(op, "out", out, qweight, "qweight");
  check_same_device(op, "topk_ids", topk_ids, qweight, "qweight");
  VLLM_VOLTA_CHECK(topk_ids.scalar_type() == ScalarType::Int && topk_ids.dim() == 2, op,
                  ": 'topk_ids' must be int32 [num_tokens, top_k]");
  check_contiguous(op, "topk_ids", topk_ids);
  a.tokens = topk_ids.size(0);
  a.top_k = topk_ids.size(1);
  VLLM_VOLTA_CHECK(a.tokens < (int64_t{1} << 24) && a.top_k >= 1 && a.top_k <= 32, op,
                  ": 'topk_ids' must be [num_tokens < 2^24, 1 <= top_k <= 32]");
  if (gated) {
    VLLM_VOLTA_CHECK(a.n % 2 == 0, op, ": 'qweight' must be [E, 2I, H / 8] (gate rows, then up rows)");
    a.n /= 2;
    VLLM_VOLTA_CHECK(input.dim() == 2 && input.size(0) == a.tokens && input.size(1) == a.k, op,
                    ": 'input' must be [num_tokens, hidden] = [", a.tokens, ", ", a.k, "]");
    VLLM_VOLTA_CHECK(out.dim() == 3 && out.size(0) == a.tokens && out.size(1) == a.top_k && out.size(2) == a.n, op,
                    ": 'out' must be [num_tokens, top_k, intermediate] = [", a.tokens, ", ", a.top_k, ", ", a.n, "]");
  } else {
    VLLM_VOLTA_CHECK(input.dim() == 3 && input.size(0) == a.tokens && input.size(1) == a.top_k &&
                         input.size(2) == a.k,
                     op, ": 'input' must be [num_tokens, top_k, intermediate] = [", a.tokens, ", ", a.top_k, ", ",
                     a.k, "]");
    VLLM_VOLTA_CHECK(out.dim() == 2 && out.size(0) == a.tokens && out.size(1) == a.n, op,
                    ": 'out' must be [num_tokens, hidden] = [", a.tokens, ", ", a.n, "]");
  }
  if (topk_weights.has_value()) {
    VLLM_VOLTA_CHECK(topk_weights->scalar_type() == ScalarType::Float, op, ": 'topk_weights' must be float32");
    check_contiguous(op, "topk_weights", *topk_weights);
    check_same_shape(op, "topk_weights", *topk_weights, topk_ids, "topk_ids");
    check_same_device(op, "topk_weights", *topk_weights, qweight, "qweight");
  }
  return a;
}

inline void check_moe_w4_activation(const char* op, int64_t activation) {
  VLLM_VOLTA_CHECK(activation == 0 || activation == 1, op,
                  ": 'activation' must be 0 (silu) or 1 (gelu_tanh), got ", activation);
}

// moe_w4_dequantize: out float16 [n, R, K] = the weights of experts[i] (int32 [n]).
inline MoeW4Args check_moe_w4_dequantize_args(const Tensor& out, const Tensor& qweight, const Tensor& sz,
                                              const Tensor& experts) {
  const char* op = "moe_w4_dequantize";
  MoeW4Args a = check_moe_w4_weight(op, qweight, sz);
  VLLM_VOLTA_CHECK(experts.scalar_type() == ScalarType::Int && experts.dim() == 1, op,
                  ": 'experts' must be int32 [n]");
  check_contiguous(op, "experts", experts);
  check_same_device(op, "experts", experts, qweight, "qweight");
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half, op, ": 'out' must be float16");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, qweight, "qweight");
  VLLM_VOLTA_CHECK(out.dim() == 3 && out.size(0) == experts.size(0) && out.size(1) == a.n && out.size(2) == a.k, op,
                  ": 'out' must be [n, out_features, in_features] = [", experts.size(0), ", ", a.n, ", ", a.k, "]");
  a.tokens = experts.size(0);
  return a;
}

}  // namespace vllm_volta
