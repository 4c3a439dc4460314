// Argument validation of gemv and its fused forms (rms_norm_gemv, silu_and_mul_gemv), shared
// by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

constexpr int64_t kGemvMaxRows = 4;  // input rows (tokens) one launch multiplies

struct GemvArgs {
  int64_t m;  // input rows
  int64_t n;  // output features (weight rows)
  int64_t k;  // the product's input features
  int64_t in_stride;
  int64_t out_stride;
};

// The product's part: input [M, k_factor * K] float16 (1 <= M <= 4; rows contiguous, row
// stride a multiple of 8), weight [N, K] contiguous, K % 8 == 0 (16-byte vectors),
// out [M, N] (rows contiguous), bias [N].
inline GemvArgs check_gemv_product(const char* op, const Tensor& out, const Tensor& input, int64_t k_factor,
                                   const Tensor& weight, const std::optional<Tensor>& bias) {
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half, op, ": 'input' must be float16, got ",
                  dtype_name(input.scalar_type()));
  check_same_dtype(op, "weight", weight, input, "input");
  check_same_dtype(op, "out", out, input, "input");
  check_same_device(op, "weight", weight, input, "input");
  check_same_device(op, "out", out, input, "input");
  VLLM_VOLTA_CHECK(input.dim() == 2 && weight.dim() == 2 && out.dim() == 2, op,
                  ": 'input' [M, K], 'weight' [N, K] and 'out' [M, N] must be 2-D");
  const int64_t m = input.size(0), k = weight.size(1), n = weight.size(0);
  VLLM_VOLTA_CHECK(m >= 1 && m <= kGemvMaxRows, op, ": 'input' must have 1 to ", kGemvMaxRows, " rows, got ", m);
  VLLM_VOLTA_CHECK(input.size(1) == k_factor * k, op, ": 'weight' must be [N, K] with K = ",
                  k_factor == 1 ? "input.size(1) = " : "input.size(1) / 2 = ", input.size(1) / k_factor,
                  ", got ", k);
  VLLM_VOLTA_CHECK(k >= 8 && k % 8 == 0, op, ": K (input features) must be a positive multiple of 8, got ", k);
  VLLM_VOLTA_CHECK(n >= 1 && n < (int64_t{1} << 31), op, ": N (weight rows) must be in [1, 2^31), got ", n);
  VLLM_VOLTA_CHECK(out.size(0) == m && out.size(1) == n, op, ": 'out' must be [M, N] = [", m, ", ", n, "]");
  check_contiguous(op, "weight", weight);
  VLLM_VOLTA_CHECK(input.stride(1) == 1 && (m == 1 || input.stride(0) % 8 == 0), op,
                  ": 'input' rows must be contiguous, with a row stride that is a multiple of 8");
  VLLM_VOLTA_CHECK(out.stride(1) == 1, op, ": 'out' rows must be contiguous");
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, input, "input");
    check_same_device(op, "bias", *bias, input, "input");
    VLLM_VOLTA_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous(), op,
                    ": 'bias' must be contiguous and 1-D of size N = ", n);
  }
  return {m, n, k, m > 1 ? input.stride(0) : k_factor * k, m > 1 ? out.stride(0) : n};
}

// gemv(out, input, weight, bias, rows_per_block): rows_per_block 0 (automatic), 2, 4 or 8.
inline GemvArgs check_gemv_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                const std::optional<Tensor>& bias, int64_t rows_per_block) {
  const char* op = "gemv";
  const GemvArgs a = check_gemv_product(op, out, input, 1, weight, bias);
  VLLM_VOLTA_CHECK(rows_per_block == 0 || rows_per_block == 2 || rows_per_block == 4 || rows_per_block == 8, op,
                  ": 'rows_per_block' must be 0 (automatic), 2, 4 or 8, got ", rows_per_block);
  return a;
}

// rms_norm_gemv(out, input, residual, residual_out, norm_weight, epsilon, weight, bias):
// input [M, K] contiguous; residual and residual_out both given ([M, K] contiguous) or both
// absent; norm_weight [K].
inline GemvArgs check_rms_norm_gemv_args(const Tensor& out, const Tensor& input,
                                         const std::optional<Tensor>& residual,
                                         const std::optional<Tensor>& residual_out, const Tensor& norm_weight,
                                         double epsilon, const Tensor& weight, const std::optional<Tensor>& bias) {
  const char* op = "rms_norm_gemv";
  const GemvArgs a = check_gemv_product(op, out, input, 1, weight, bias);
  check_contiguous(op, "input", input);
  VLLM_VOLTA_CHECK(residual.has_value() == residual_out.has_value(), op,
                  ": 'residual' and 'residual_out' must be given together");
  for (const auto* t : {&residual, &residual_out}) {
    if (!t->has_value()) continue;
    const char* name = t == &residual ? "residual" : "residual_out";
    check_same_dtype(op, name, **t, input, "input");
    check_same_device(op, name, **t, input, "input");
    check_same_shape(op, name, **t, input, "input");
    check_contiguous(op, name, **t);
  }
  check_same_dtype(op, "norm_weight", norm_weight, input, "input");
  check_same_device(op, "norm_weight", norm_weight, input, "input");
  VLLM_VOLTA_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == a.k && norm_weight.is_contiguous(), op,
                  ": 'norm_weight' must be contiguous and 1-D of size K = ", a.k);
  check_epsilon(op, epsilon);
  return a;
}

// silu_and_mul_gemv(out, input, weight, bias): input [M, 2K] = [gate | up].
inline GemvArgs check_silu_and_mul_gemv_args(const Tensor& out, const Tensor& input, const Tensor& weight,
                                             const std::optional<Tensor>& bias) {
  return check_gemv_product("silu_and_mul_gemv", out, input, 2, weight, bias);
}

}  // namespace vllm_volta
