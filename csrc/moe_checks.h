// Argument validation of the mixture-of-experts ops (routing, expert ordering, the decode GEMVs,
// the grouped GEMM, moe_sum), shared by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

constexpr int64_t kMoeMaxExperts = 1024;  // moe_align_block_size counts experts in shared memory
constexpr int64_t kMoeMaxTopK = 32;       // topk_softmax keeps a token's choices in registers

inline void check_int32_tensor(const char* op, const char* arg, const Tensor& t) {
  VLLM_VOLTA_CHECK(t.scalar_type() == ScalarType::Int, op, ": '", arg, "' must be int32");
  check_contiguous(op, arg, t);
}

struct MoeRoutingArgs {
  int64_t tokens;
  int64_t experts;
  int64_t top_k;
};

// topk_softmax / topk_sigmoid: gating_output [T, E] float (any of the three float dtypes),
// contiguous; topk_weights float32 [T, k]; topk_ids and token_expert_indices int32 [T, k].
inline MoeRoutingArgs check_topk_args(const char* op, const Tensor& topk_weights, const Tensor& topk_ids,
                                      const Tensor& token_expert_indices, const Tensor& gating_output) {
  check_float_dtype(op, "gating_output", gating_output);
  VLLM_VOLTA_CHECK(gating_output.dim() == 2, op, ": 'gating_output' must be 2-D [num_tokens, num_experts]");
  check_contiguous(op, "gating_output", gating_output);
  const int64_t t = gating_output.size(0), e = gating_output.size(1);
  VLLM_VOLTA_CHECK(e >= 1 && e <= kMoeMaxExperts, op, ": num_experts must be in [1, ", kMoeMaxExperts, "], got ", e);
  VLLM_VOLTA_CHECK(topk_weights.scalar_type() == ScalarType::Float, op, ": 'topk_weights' must be float32");
  VLLM_VOLTA_CHECK(topk_weights.dim() == 2 && topk_weights.size(0) == t, op,
                  ": 'topk_weights' must be [num_tokens, top_k] with num_tokens = ", t);
  const int64_t k = topk_weights.size(1);
  VLLM_VOLTA_CHECK(k >= 1 && k <= e && k <= kMoeMaxTopK, op, ": top_k must be in [1, min(num_experts, ",
                  kMoeMaxTopK, ")], got ", k);
  check_contiguous(op, "topk_weights", topk_weights);
  check_int32_tensor(op, "topk_ids", topk_ids);
  check_int32_tensor(op, "token_expert_indices", token_expert_indices);
  check_same_shape(op, "topk_ids", topk_ids, topk_weights, "topk_weights");
  check_same_shape(op, "token_expert_indices", token_expert_indices, topk_weights, "topk_weights");
  check_same_device(op, "topk_weights", topk_weights, gating_output, "gating_output");
  check_same_device(op, "topk_ids", topk_ids, gating_output, "gating_output");
  check_same_device(op, "token_expert_indices", token_expert_indices, gating_output, "gating_output");
  return {t, e, k};
}

// The length of sorted_token_ids for P (token, expert) pairs: every expert padded up to a multiple
// of block_size, in the worst case block_size - 1 rows of padding per expert.
inline int64_t moe_max_padded(int64_t pairs, int64_t experts, int64_t block_size) {
  return pairs + experts * (block_size - 1);
}

// moe_align_block_size: topk_ids int32 [T, k] (contiguous); sorted_token_ids int32 with at least
// T k + E (block_size - 1) entries; experts_ids int32 with at least ceil(that / block_size);
// num_tokens_post_pad int32 [1].
inline int64_t check_moe_align_args(const Tensor& topk_ids, int64_t num_experts, int64_t block_size,
                                    const Tensor& sorted_token_ids, const Tensor& experts_ids,
                                    const Tensor& num_tokens_post_pad) {
  const char* op = "moe_align_block_size";
  check_int32_tensor(op, "topk_ids", topk_ids);
  check_int32_tensor(op, "sorted_token_ids", sorted_token_ids);
  check_int32_tensor(op, "experts_ids", experts_ids);
  check_int32_tensor(op, "num_tokens_post_pad", num_tokens_post_pad);
  VLLM_VOLTA_CHECK(num_experts >= 1 && num_experts <= kMoeMaxExperts, op, ": 'num_experts' must be in [1, ",
                  kMoeMaxExperts, "], got ", num_experts);
  VLLM_VOLTA_CHECK(block_size >= 1 && block_size <= 256, op, ": 'block_size' must be in [1, 256], got ", block_size);
  const int64_t pairs = topk_ids.numel(), padded = moe_max_padded(pairs, num_experts, block_size);
  VLLM_VOLTA_CHECK(pairs < (int64_t{1} << 30), op, ": 'topk_ids' must have fewer than 2^30 entries");
  VLLM_VOLTA_CHECK(sorted_token_ids.dim() == 1 && sorted_token_ids.size(0) >= padded, op,
                  ": 'sorted_token_ids' must be 1-D with at least numel(topk_ids) + num_experts * (block_size - 1) = ",
                  padded, " entries");
  VLLM_VOLTA_CHECK(experts_ids.dim() == 1 && experts_ids.size(0) >= (padded + block_size - 1) / block_size, op,
                  ": 'experts_ids' must be 1-D with at least ceil(", padded, " / block_size) entries");
  VLLM_VOLTA_CHECK(num_tokens_post_pad.numel() == 1, op, ": 'num_tokens_post_pad' must have one element");
  check_same_device(op, "sorted_token_ids", sorted_token_ids, topk_ids, "topk_ids");
  check_same_device(op, "experts_ids", experts_ids, topk_ids, "topk_ids");
  check_same_device(op, "num_tokens_post_pad", num_tokens_post_pad, topk_ids, "topk_ids");
  return pairs;
}

// moe_sum: input [T, k, H] -> output [T, H], same float dtype, both contiguous.
inline void check_moe_sum_args(const Tensor& input, const Tensor& output) {
  const char* op = "moe_sum";
  check_float_dtype(op, "input", input);
  check_same_dtype(op, "output", output, input, "input");
  check_same_device(op, "output", output, input, "input");
  VLLM_VOLTA_CHECK(input.dim() == 3 && output.dim() == 2 && output.size(0) == input.size(0) &&
                      output.size(1) == input.size(2),
                  op, ": 'input' must be [num_tokens, top_k, hidden] and 'output' [num_tokens, hidden]");
  check_contiguous(op, "input", input);
  check_contiguous(op, "output", output);
}

// Elements per 16-byte vector of a float dtype.
inline int64_t moe_vec_elems(ScalarType t) { return t == ScalarType::Float ? 4 : 8; }

struct MoeGemvArgs {
  int64_t tokens;
  int64_t top_k;
  int64_t experts;
  int64_t n;  // output features per (token, expert) pair
  int64_t k;  // input features
};

// moe_gemv_silu_and_mul: out [T, k, I] = silu(x W_e[:I]^T) * (x W_e[I:]^T) for each token's chosen
//   experts e = topk_ids[t, j]; input [T, H], w13 [E, 2I, H].
// moe_gemv_down_sum: out [T, H] = sum_j topk_weights[t, j] * (input[t, j] W_e^T); input [T, k, I],
//   w2 [E, H, I].
// All contiguous, one float dtype; topk_ids int32 [T, k], topk_weights float32 [T, k]; the input
// features a multiple of a 16-byte vector (8 half / 4 float); rows_per_block 0 (auto), 2, 4 or 8.
inline MoeGemvArgs check_moe_gemv_args(const char* op, const Tensor& out, const Tensor& input, const Tensor& weight,
                                       const Tensor& topk_ids, const std::optional<Tensor>& topk_weights,
                                       int64_t rows_per_block, bool gated) {
  check_float_dtype(op, "input", input);
  check_same_dtype(op, "weight", weight, input, "input");
  check_same_dtype(op, "out", out, input, "input");
  check_same_device(op, "weight", weight, input, "input");
  check_same_device(op, "out", out, input, "input");
  check_same_device(op, "topk_ids", topk_ids, input, "input");
  check_contiguous(op, "input", input);
  check_contiguous(op, "weight", weight);
  check_contiguous(op, "out", out);
  check_int32_tensor(op, "topk_ids", topk_ids);
  VLLM_VOLTA_CHECK(topk_ids.dim() == 2, op, ": 'topk_ids' must be [num_tokens, top_k]");
  const int64_t t = topk_ids.size(0), top_k = topk_ids.size(1);
  VLLM_VOLTA_CHECK(weight.dim() == 3, op, ": 'weight' must be 3-D [num_experts, out_features, in_features]");
  const int64_t experts = weight.size(0), k = weight.size(2), rows = weight.size(1);
  const int64_t n = gated ? rows / 2 : rows;
  VLLM_VOLTA_CHECK(!gated || rows % 2 == 0, op, ": 'w13' must be [E, 2I, H] (gate rows, then up rows)");
  VLLM_VOLTA_CHECK(rows >= 1 && experts * rows < (int64_t{1} << 31), op,
                  ": 'weight' must have between 1 and 2^31 rows in all");
  const int64_t vec = moe_vec_elems(input.scalar_type());
  VLLM_VOLTA_CHECK(k >= vec && k % vec == 0, op, ": in_features must be a positive multiple of ", vec,
                  " (16-byte vectors), got ", k);
  if (gated) {
    VLLM_VOLTA_CHECK(input.dim() == 2 && input.size(0) == t && input.size(1) == k, op,
                    ": 'input' must be [num_tokens, hidden] = [", t, ", ", k, "]");
    VLLM_VOLTA_CHECK(out.dim() == 3 && out.size(0) == t && out.size(1) == top_k && out.size(2) == n, op,
                    ": 'out' must be [num_tokens, top_k, intermediate] = [", t, ", ", top_k, ", ", n, "]");
  } else {
    VLLM_VOLTA_CHECK(input.dim() == 3 && input.size(0) == t && input.size(1) == top_k && input.size(2) == k, op,
                    ": 'input' must be [num_tokens, top_k, intermediate] = [", t, ", ", top_k, ", ", k, "]");
    VLLM_VOLTA_CHECK(out.dim() == 2 && out.size(0) == t && out.size(1) == n, op,
                    ": 'out' must be [num_tokens, hidden] = [", t, ", ", n, "]");
  }
  if (topk_weights.has_value()) {
    VLLM_VOLTA_CHECK(topk_weights->scalar_type() == ScalarType::Float, op, ": 'topk_weights' must be float32");
    check_contiguous(op, "topk_weights", *topk_weights);
    check_same_shape(op, "topk_weights", *topk_weights, topk_ids, "topk_ids");
    check_same_device(op, "topk_weights", *topk_weights, input, "input");
  }
  VLLM_VOLTA_CHECK(t < (int64_t{1} << 24) && top_k >= 1 && top_k <= kMoeMaxTopK, op,
                  ": 'topk_ids' must be [num_tokens < 2^24, 1 <= top_k <= ", kMoeMaxTopK, "]");
  VLLM_VOLTA_CHECK(rows_per_block == 0 || rows_per_block == 2 || rows_per_block == 4 || rows_per_block == 8, op,
                  ": 'rows_per_block' must be 0 (automatic), 2, 4 or 8, got ", rows_per_block);
  return {t, top_k, experts, n, k};
}

struct MoeGemmArgs {
  int64_t pairs;  // rows of out: (token, expert) pairs
  int64_t n;
  int64_t k;
  int64_t max_blocks;  // blocks of sorted rows the grid covers
};

// moe_grouped_gemm: out [P, N] (P = numel of sorted pairs' space), out[p] = input[p / top_k] W_e^T
// (times topk_weights.flatten()[p] when given) for each sorted pair p in a block of expert e.
// input [P / top_k, K] float16 (bfloat16 on SM80+), weight [E, N, K], K % 8 == 0; the sorted
// pairs as moe_align_block_size leaves them for this block_size (16, 32 or 64).
inline MoeGemmArgs check_moe_gemm_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                       const Tensor& sorted_token_ids, const Tensor& experts_ids,
                                       const Tensor& num_tokens_post_pad, const std::optional<Tensor>& topk_weights,
                                       int64_t top_k, int64_t block_size) {
  const char* op = "moe_grouped_gemm";
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half || input.scalar_type() == ScalarType::BFloat16, op,
                  ": 'input' must be float16 or bfloat16 (tensor cores), got ", dtype_name(input.scalar_type()));
  check_same_dtype(op, "weight", weight, input, "input");
  check_same_dtype(op, "out", out, input, "input");
  check_same_device(op, "weight", weight, input, "input");
  check_same_device(op, "out", out, input, "input");
  check_same_device(op, "sorted_token_ids", sorted_token_ids, input, "input");
  check_same_device(op, "experts_ids", experts_ids, input, "input");
  check_same_device(op, "num_tokens_post_pad", num_tokens_post_pad, input, "input");
  check_contiguous(op, "input", input);
  check_contiguous(op, "weight", weight);
  check_contiguous(op, "out", out);
  check_int32_tensor(op, "sorted_token_ids", sorted_token_ids);
  check_int32_tensor(op, "experts_ids", experts_ids);
  check_int32_tensor(op, "num_tokens_post_pad", num_tokens_post_pad);
  VLLM_VOLTA_CHECK(block_size == 16 || block_size == 32 || block_size == 64, op,
                  ": 'block_size' must be 16, 32 or 64, got ", block_size);
  VLLM_VOLTA_CHECK(top_k >= 1 && top_k <= kMoeMaxTopK, op, ": 'top_k' must be in [1, ", kMoeMaxTopK, "], got ", top_k);
  VLLM_VOLTA_CHECK(weight.dim() == 3 && input.dim() == 2 && out.dim() == 2, op,
                  ": 'weight' must be [E, N, K], 'input' [tokens, K] and 'out' [tokens * top_k, N]");
  const int64_t n = weight.size(1), k = weight.size(2), pairs = input.size(0) * top_k;
  VLLM_VOLTA_CHECK(input.size(1) == k && k >= 8 && k % 8 == 0, op,
                  ": K must match 'weight' and be a positive multiple of 8, got ", input.size(1));
  VLLM_VOLTA_CHECK(out.size(0) == pairs && out.size(1) == n, op, ": 'out' must be [", pairs, ", ", n, "]");
  VLLM_VOLTA_CHECK(n >= 1 && weight.size(0) * n * k < (int64_t{1} << 40), op, ": 'weight' is empty or too large");
  VLLM_VOLTA_CHECK(sorted_token_ids.dim() == 1 && experts_ids.dim() == 1 &&
                      experts_ids.size(0) * block_size >= sorted_token_ids.size(0),
                  op, ": 'experts_ids' must hold one entry per block of 'sorted_token_ids'");
  VLLM_VOLTA_CHECK(num_tokens_post_pad.numel() == 1, op, ": 'num_tokens_post_pad' must have one element");
  if (topk_weights.has_value()) {
    VLLM_VOLTA_CHECK(topk_weights->scalar_type() == ScalarType::Float && topk_weights->numel() == pairs, op,
                    ": 'topk_weights' must be float32 with one entry per pair (", pairs, ")");
    check_contiguous(op, "topk_weights", *topk_weights);
    check_same_device(op, "topk_weights", *topk_weights, input, "input");
  }
  return {pairs, n, k, (sorted_token_ids.size(0) + block_size - 1) / block_size};
}

}  // namespace vllm_volta
