// Argument validation of the FP8-weight ops (fp8_gemv, fp8_dequantize), shared by the CUDA
// launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <optional>

namespace vllm_volta {

constexpr int64_t kFp8MaxGemvRows = 8;  // kFp8GemvMaxRows in kernels/fp8_gemv.cuh

struct Fp8WeightArgs {
  int64_t n;          // output features (weight rows)
  int64_t k;          // input features
  int64_t groups;     // scale columns: 1 (per row) or ceil(K / group_k)
  int64_t group_k;
};

// weight float8_e4m3fn [N, K] contiguous, K a multiple of 16 (16-byte vectors); scales float32
// [N, G] contiguous with G = 1 or G = ceil(K / group_k), group_k a positive multiple of 16.
inline Fp8WeightArgs check_fp8_weight(const char* op, const Tensor& weight, const Tensor& scales, int64_t group_k) {
  VLLM_VOLTA_CHECK(weight.scalar_type() == ScalarType::Float8_e4m3fn && weight.dim() == 2, op,
                  ": 'weight' must be a 2-D float8_e4m3fn tensor [N, K]");
  VLLM_VOLTA_CHECK(scales.scalar_type() == ScalarType::Float && scales.dim() == 2, op,
                  ": 'scales' must be a 2-D float32 tensor [N, G]");
  check_same_device(op, "scales", scales, weight, "weight");
  check_contiguous(op, "weight", weight);
  check_contiguous(op, "scales", scales);
  const int64_t n = weight.size(0), k = weight.size(1), groups = scales.size(1);
  VLLM_VOLTA_CHECK(n >= 1 && n < (int64_t{1} << 31), op, ": 'weight' rows must be in [1, 2^31), got ", n);
  VLLM_VOLTA_CHECK(k >= 16 && k % 16 == 0 && k < (int64_t{1} << 31), op,
                  ": K (input features) must be a positive multiple of 16 below 2^31, got ", k);
  VLLM_VOLTA_CHECK(group_k >= 16 && group_k % 16 == 0, op, ": 'group_k' must be a positive multiple of 16, got ",
                  group_k);
  const int64_t expected = (k + group_k - 1) / group_k;
  VLLM_VOLTA_CHECK(scales.size(0) == n && (groups == 1 || groups == expected), op, ": 'scales' must be [N, 1] or [N, ",
                  "ceil(K / group_k)] = [", n, ", ", expected, "], got [", scales.size(0), ", ", groups, "]");
  return {n, k, groups, group_k};
}

inline bool is_fp8_activation_type(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }

// out float16 / bfloat16 [N, K] contiguous.
inline Fp8WeightArgs check_fp8_dequantize_args(const Tensor& out, const Tensor& weight, const Tensor& scales,
                                               int64_t group_k) {
  const char* op = "fp8_dequantize";
  const Fp8WeightArgs a = check_fp8_weight(op, weight, scales, group_k);
  VLLM_VOLTA_CHECK(is_fp8_activation_type(out.scalar_type()) && out.dim() == 2 && out.size(0) == a.n &&
                      out.size(1) == a.k, op, ": 'out' must be a float16 or bfloat16 tensor [", a.n, ", ", a.k, "]");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, weight, "weight");
  return a;
}

// input float16 or bfloat16 [M, K] (fp8_gemv: 1 <= M <= 8; fp8_gemm: 1 <= M < 2^31; contiguous
// rows, row stride a multiple of 8), out [M, N] (contiguous rows) and bias [N] (contiguous, or
// none) of input's dtype; fp8_gemm's split_k: 0 (automatic) or 1 to ceil(K / 128).
inline Fp8WeightArgs check_fp8_linear_args(const char* op, const Tensor& out, const Tensor& input,
                                           const Tensor& weight, const Tensor& scales, int64_t group_k,
                                           const std::optional<Tensor>& bias, int64_t max_rows) {
  const Fp8WeightArgs a = check_fp8_weight(op, weight, scales, group_k);
  VLLM_VOLTA_CHECK(is_fp8_activation_type(input.scalar_type()) && input.dim() == 2 && input.size(1) == a.k, op,
                  ": 'input' must be a float16 or bfloat16 tensor [M, ", a.k, "]");
  const int64_t m = input.size(0);
  VLLM_VOLTA_CHECK(m >= 1 && m <= max_rows, op, ": 'input' must have 1 to ", max_rows, " rows, got ", m);
  VLLM_VOLTA_CHECK(input.stride(1) == 1 && (m == 1 || input.stride(0) % 8 == 0), op,
                  ": 'input' rows must be contiguous, with a row stride that is a multiple of 8");
  check_same_device(op, "input", input, weight, "weight");
  check_same_dtype(op, "out", out, input, "input");
  VLLM_VOLTA_CHECK(out.dim() == 2 && out.size(0) == m && out.size(1) == a.n, op, ": 'out' must be [", m, ", ", a.n,
                  "]");
  VLLM_VOLTA_CHECK(out.stride(1) == 1, op, ": 'out' rows must be contiguous");
  check_same_device(op, "out", out, weight, "weight");
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, input, "input");
    VLLM_VOLTA_CHECK(bias->dim() == 1 && bias->size(0) == a.n && bias->is_contiguous(), op,
                    ": 'bias' must be a contiguous 1-D tensor [", a.n, "]");
    check_same_device(op, "bias", *bias, weight, "weight");
  }
  return a;
}

// fp8_gemv's rows_per_block: 0 (automatic), 2, 4 or 8 (8: up to 2 input rows; more would not fit
// the registers).
inline Fp8WeightArgs check_fp8_gemv_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                         const Tensor& scales, int64_t group_k, const std::optional<Tensor>& bias,
                                         int64_t rows_per_block) {
  const char* op = "fp8_gemv";
  const Fp8WeightArgs a = check_fp8_linear_args(op, out, input, weight, scales, group_k, bias, kFp8MaxGemvRows);
  VLLM_VOLTA_CHECK(rows_per_block == 0 || rows_per_block == 2 || rows_per_block == 4 ||
                      (rows_per_block == 8 && input.size(0) <= 2),
                  op, ": 'rows_per_block' must be 0 (automatic), 2, 4 or 8 (8: up to 2 input rows), got ",
                  rows_per_block, " for ", input.size(0), " rows");
  return a;
}

inline Fp8WeightArgs check_fp8_gemm_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                         const Tensor& scales, int64_t group_k, const std::optional<Tensor>& bias,
                                         int64_t split_k) {
  const char* op = "fp8_gemm";
  const Fp8WeightArgs a =
      check_fp8_linear_args(op, out, input, weight, scales, group_k, bias, (int64_t{1} << 31) - 1);
  const int64_t steps = (a.k + 127) / 128;
  VLLM_VOLTA_CHECK(split_k >= 0 && split_k <= steps, op, ": 'split_k' must be 0 (automatic) or 1 to ceil(K / 128) = ",
                  steps, ", got ", split_k);
  return a;
}

}  // namespace vllm_volta
