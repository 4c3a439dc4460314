// Argument validation of the GGUF-block ops (gguf_gemv, gguf_dequantize), shared by the CUDA
// launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <optional>

namespace vllm_volta {

constexpr int64_t kGgufMaxGemvRows = 8;  // kGgufGemvMaxRows in kernels/gguf.cuh

struct GgufBlockType {
  int64_t block_elems;
  int64_t block_bytes;
};

// (weights, bytes) per block of the GGML types these ops take; id as gguf.GGMLQuantizationType.
inline GgufBlockType gguf_block_type(const char* op, int64_t qtype) {
  switch (qtype) {
    case 2: return {32, 18};     // Q4_0
    case 8: return {32, 34};     // Q8_0
    case 12: return {256, 144};  // Q4_K
    case 13: return {256, 176};  // Q5_K
    case 14: return {256, 210};  // Q6_K
    default:
      VLLM_VOLTA_CHECK(false, op, ": 'qtype' must be a GGML type id among 2 (Q4_0), 8 (Q8_0), 12 (Q4_K), ",
                      "13 (Q5_K), 14 (Q6_K), got ", qtype);
  }
  return {0, 0};
}

struct GgufWeightArgs {
  int64_t n;          // output features (weight rows)
  int64_t k;          // input features
  int64_t row_bytes;  // bytes of one weight row (k / block_elems blocks)
};

// weight uint8 [N, row_bytes] contiguous (the GGUF blocks of each row), K a multiple of the
// type's block size with row_bytes = K / block_elems * block_bytes.
inline GgufWeightArgs check_gguf_weight(const char* op, const Tensor& weight, int64_t qtype, int64_t k) {
  const GgufBlockType t = gguf_block_type(op, qtype);
  VLLM_VOLTA_CHECK(weight.scalar_type() == ScalarType::Byte && weight.dim() == 2, op,
                  ": 'weight' must be a 2-D uint8 tensor [N, row_bytes] of GGUF blocks");
  check_contiguous(op, "weight", weight);
  const int64_t n = weight.size(0);
  VLLM_VOLTA_CHECK(n >= 1 && n < (int64_t{1} << 31), op, ": 'weight' rows must be in [1, 2^31), got ", n);
  VLLM_VOLTA_CHECK(k >= t.block_elems && k % t.block_elems == 0 && k < (int64_t{1} << 31), op,
                  ": K (input features) must be a positive multiple of ", t.block_elems, " below 2^31 for GGML type ",
                  qtype, ", got ", k);
  const int64_t row_bytes = k / t.block_elems * t.block_bytes;
  VLLM_VOLTA_CHECK(weight.size(1) == row_bytes, op, ": 'weight' must be [N, ", row_bytes, "] (", k / t.block_elems,
                  " blocks of ", t.block_bytes, " bytes per row for K = ", k, "), got [", n, ", ", weight.size(1), "]");
  return {n, k, row_bytes};
}

// out float16 [N, K] contiguous.
inline GgufWeightArgs check_gguf_dequantize_args(const Tensor& out, const Tensor& weight, int64_t qtype) {
  const char* op = "gguf_dequantize";
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2, op,
                  ": 'out' must be a 2-D float16 tensor [N, K]");
  const GgufWeightArgs a = check_gguf_weight(op, weight, qtype, out.size(1));
  VLLM_VOLTA_CHECK(out.size(0) == a.n, op, ": 'out' must have the weight's ", a.n, " rows, got ", out.size(0));
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, weight, "weight");
  return a;
}

// input float16 [M, K] (1 <= M <= 8, contiguous rows, row stride a multiple of 8), out float16
// [M, N] (contiguous rows; may be a column slice of a wider output), bias float16 [N] or none.
inline GgufWeightArgs check_gguf_gemv_args(const Tensor& out, const Tensor& input, const Tensor& weight, int64_t qtype,
                                           const std::optional<Tensor>& bias) {
  const char* op = "gguf_gemv";
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half && input.dim() == 2, op,
                  ": 'input' must be a 2-D float16 tensor [M, K]");
  const GgufWeightArgs a = check_gguf_weight(op, weight, qtype, input.size(1));
  const int64_t m = input.size(0);
  VLLM_VOLTA_CHECK(m >= 1 && m <= kGgufMaxGemvRows, op, ": 'input' must have 1 to ", kGgufMaxGemvRows,
                  " rows, got ", m);
  VLLM_VOLTA_CHECK(input.stride(1) == 1 && (m == 1 || input.stride(0) % 8 == 0), op,
                  ": 'input' rows must be contiguous, with a row stride that is a multiple of 8");
  check_same_device(op, "input", input, weight, "weight");
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2 && out.size(0) == m &&
                      out.size(1) == a.n, op, ": 'out' must be a float16 tensor [", m, ", ", a.n, "]");
  VLLM_VOLTA_CHECK(out.stride(1) == 1, op, ": 'out' rows must be contiguous");
  check_same_device(op, "out", out, weight, "weight");
  if (bias.has_value()) {
    VLLM_VOLTA_CHECK(bias->scalar_type() == ScalarType::Half && bias->dim() == 1 && bias->size(0) == a.n &&
                        bias->stride(0) == 1, op, ": 'bias' must be a contiguous float16 tensor [", a.n, "]");
    check_same_device(op, "bias", *bias, weight, "weight");
  }
  return a;
}

}  // namespace vllm_volta
