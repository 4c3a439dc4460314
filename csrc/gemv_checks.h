// Argument validation of gemv, gemv_silu_and_mul and gemv_add, shared by the CUDA launcher and
// the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>
#include <utility>

namespace vllm_volta {

constexpr int64_t kGemvMaxRows = 4;  // input rows (tokens) one launch multiplies

struct GemvArgs {
  int64_t m;  // input rows
  int64_t n;  // output features (weight rows; gated: half of them)
  int64_t k;  // input features
  int64_t in_stride;
  int64_t out_stride;
};

// gemv: out [M, N] = input [M, K] @ weight[N, K]^T (+ bias [N]); gemv_add the same shapes;
// gated (gemv_silu_and_mul): weight [2N, K] (+ bias [2N]) and out [M, N]. float16, 1 <= M <= 4, K % 8 == 0 (16-byte
// vectors); input and out rows may be strided (row strides multiples of 8), weight and bias
// contiguous; rows_per_block 0 (automatic), 2, 4 or 8. gemv and gemv_silu_and_mul may also
// RMS-normalize the input first: norm_weight [K] (contiguous, float16) and epsilon > 0.
inline GemvArgs check_gemv_args(const char* op, const Tensor& out, const Tensor& input, const Tensor& weight,
                                const std::optional<Tensor>& bias, int64_t rows_per_block, bool gated,
                                const std::optional<Tensor>& norm_weight = std::nullopt, double epsilon = 0.0) {
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half, op, ": 'input' must be float16, got ",
                  dtype_name(input.scalar_type()));
  check_same_dtype(op, "weight", weight, input, "input");
  check_same_dtype(op, "out", out, input, "input");
  check_same_device(op, "weight", weight, input, "input");
  check_same_device(op, "out", out, input, "input");
  VLLM_VOLTA_CHECK(input.dim() == 2 && weight.dim() == 2 && out.dim() == 2, op,
                  ": 'input' [M, K], 'weight' [N, K] and 'out' [M, N] must be 2-D");
  const int64_t m = input.size(0), k = input.size(1), rows = weight.size(0), n = gated ? rows / 2 : rows;
  VLLM_VOLTA_CHECK(m >= 1 && m <= kGemvMaxRows, op, ": 'input' must have 1 to ", kGemvMaxRows, " rows, got ", m);
  VLLM_VOLTA_CHECK(weight.size(1) == k, op, ": 'weight' must be [N, K] with K = input.size(1) = ", k, ", got ",
                  weight.size(1));
  VLLM_VOLTA_CHECK(k >= 8 && k % 8 == 0, op, ": K (input features) must be a positive multiple of 8, got ", k);
  VLLM_VOLTA_CHECK(rows >= 1 && rows < (int64_t{1} << 31), op, ": 'weight' rows must be in [1, 2^31), got ", rows);
  VLLM_VOLTA_CHECK(!gated || rows % 2 == 0, op, ": 'weight' must be [2N, K] (gate rows, then up rows), got ",
                  rows, " rows");
  VLLM_VOLTA_CHECK(out.size(0) == m && out.size(1) == n, op, ": 'out' must be [M, N] = [", m, ", ", n, "]");
  check_contiguous(op, "weight", weight);
  VLLM_VOLTA_CHECK(input.stride(1) == 1 && (m == 1 || input.stride(0) % 8 == 0), op,
                  ": 'input' rows must be contiguous, with a row stride that is a multiple of 8");
  VLLM_VOLTA_CHECK(out.stride(1) == 1, op, ": 'out' rows must be contiguous");
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, input, "input");
    check_same_device(op, "bias", *bias, input, "input");
    VLLM_VOLTA_CHECK(bias->dim() == 1 && bias->size(0) == rows && bias->is_contiguous(), op,
                    ": 'bias' must be contiguous and 1-D of size ", gated ? "2N = " : "N = ", rows);
  }
  if (norm_weight.has_value()) {
    check_same_dtype(op, "norm_weight", *norm_weight, input, "input");
    check_same_device(op, "norm_weight", *norm_weight, input, "input");
    VLLM_VOLTA_CHECK(norm_weight->dim() == 1 && norm_weight->size(0) == k && norm_weight->is_contiguous(), op,
                    ": 'norm_weight' must be contiguous and 1-D of size K = ", k);
    VLLM_VOLTA_CHECK(epsilon > 0.0, op, ": 'epsilon' must be > 0 with a norm_weight, got ", epsilon);
  }
  VLLM_VOLTA_CHECK(rows_per_block == 0 || rows_per_block == 2 || rows_per_block == 4 || rows_per_block == 8, op,
                  ": 'rows_per_block' must be 0 (automatic), 2, 4 or 8, got ", rows_per_block);
  return {m, n, k, m > 1 ? input.stride(0) : k, m > 1 ? out.stride(0) : n};
}

struct GemvRopeArgs {
  int64_t head_size;
  int64_t q_size;   // query features of out
  int64_t kv_size;  // key (and value) features of out: num_kv_heads * head_size
  int64_t num_slots;
};

// gemv_rope_cache: gemv's contract for out [M, N] (N = q_size + 2 kv_size, rows q | k | v),
// plus kv_cache [2, num_blocks, block_size, num_kv_heads, head_size] float16 contiguous,
// positions and slot_mapping int64 [M], cos_sin_cache [max_position, head_size] (full rotation)
// float32 or float16 with contiguous rows.
inline GemvRopeArgs check_gemv_rope_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                         const std::optional<Tensor>& bias, const Tensor& positions,
                                         const Tensor& kv_cache, const Tensor& slot_mapping,
                                         const Tensor& cos_sin_cache, const std::optional<Tensor>& norm_weight,
                                         double epsilon) {
  const char* op = "gemv_rope_cache";
  const GemvArgs a = check_gemv_args(op, out, input, weight, bias, 0, /*gated=*/false, norm_weight, epsilon);
  check_same_dtype(op, "kv_cache", kv_cache, input, "input");
  check_same_device(op, "kv_cache", kv_cache, input, "input");
  VLLM_VOLTA_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(), op,
                  ": 'kv_cache' must be contiguous [2, num_blocks, block_size, num_kv_heads, head_size]");
  const int64_t d = kv_cache.size(4), kv_size = kv_cache.size(3) * d, q_size = a.n - 2 * kv_size;
  VLLM_VOLTA_CHECK(d >= 2 && d % 2 == 0 && q_size > 0 && q_size % d == 0, op, ": 'out' must hold query heads, then ",
                  "the key and value heads of 'kv_cache' (", kv_size, " features each) of an even head_size ", d,
                  ", got ", a.n, " features");
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"positions", positions},
                                std::pair<const char*, const Tensor&>{"slot_mapping", slot_mapping}}) {
    VLLM_VOLTA_CHECK(t.scalar_type() == ScalarType::Long && t.dim() == 1 && t.size(0) == a.m && t.is_contiguous(),
                    op, ": '", name, "' must be contiguous int64 [M] with M = ", a.m);
    check_same_device(op, name, t, input, "input");
  }
  VLLM_VOLTA_CHECK(cos_sin_cache.scalar_type() == ScalarType::Float || cos_sin_cache.scalar_type() == ScalarType::Half,
                  op, ": 'cos_sin_cache' must be float32 or float16, got ", dtype_name(cos_sin_cache.scalar_type()));
  VLLM_VOLTA_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == d && cos_sin_cache.stride(1) == 1, op,
                  ": 'cos_sin_cache' must be [max_position, head_size = ", d, "] with contiguous rows");
  check_same_device(op, "cos_sin_cache", cos_sin_cache, input, "input");
  return {d, q_size, kv_size, kv_cache.size(1) * kv_cache.size(2)};
}

}  // namespace vllm_volta
