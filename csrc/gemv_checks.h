// Argument validation of gemv, gemv_silu_and_mul and gemv_add, shared by the CUDA launcher and
// the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

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

}  // namespace vllm_volta
