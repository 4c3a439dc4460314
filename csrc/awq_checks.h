// Argument validation of the AWQ ops, shared by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

namespace vllm_volta {

constexpr int64_t kAwqMaxGemvRows = 4;  // kAwqGemvMaxRows in kernels/awq.cuh

struct AwqArgs {
  int64_t k;            // input features
  int64_t n;            // output features
  int64_t group_size;
};

// qweight int32 [K, N / 8], qzeros int32 [K / g, N / 8], scales float16 [K / g, N], all contiguous.
inline AwqArgs check_awq_weights(const char* op, const Tensor& qweight, const Tensor& qzeros, const Tensor& scales) {
  VLLM_VOLTA_CHECK(qweight.scalar_type() == ScalarType::Int && qweight.dim() == 2, op,
                  ": 'qweight' must be a 2-D int32 tensor [K, N / 8]");
  VLLM_VOLTA_CHECK(qzeros.scalar_type() == ScalarType::Int && qzeros.dim() == 2, op,
                  ": 'qzeros' must be a 2-D int32 tensor [K / group_size, N / 8]");
  VLLM_VOLTA_CHECK(scales.scalar_type() == ScalarType::Half && scales.dim() == 2, op,
                  ": 'scales' must be a 2-D float16 tensor [K / group_size, N]");
  check_same_device(op, "qzeros", qzeros, qweight, "qweight");
  check_same_device(op, "scales", scales, qweight, "qweight");
  check_contiguous(op, "qweight", qweight);
  check_contiguous(op, "qzeros", qzeros);
  check_contiguous(op, "scales", scales);
  const int64_t k = qweight.size(0), n = qweight.size(1) * 8, groups = qzeros.size(0);
  VLLM_VOLTA_CHECK(k > 0 && n > 0 && groups > 0 && k % groups == 0, op, ": 'qzeros' has ", groups,
                  " rows, which must divide the ", k, " rows of 'qweight'");
  VLLM_VOLTA_CHECK(qzeros.size(1) * 8 == n && scales.size(0) == groups && scales.size(1) == n, op,
                  ": 'qzeros' must be [", groups, ", ", n / 8, "] and 'scales' [", groups, ", ", n, "]");
  return {k, n, k / groups};
}

inline AwqArgs check_awq_dequantize_args(const Tensor& out, const Tensor& qweight, const Tensor& qzeros,
                                         const Tensor& scales) {
  const char* op = "awq_dequantize";
  const AwqArgs a = check_awq_weights(op, qweight, qzeros, scales);
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2 && out.size(0) == a.k &&
                      out.size(1) == a.n, op, ": 'out' must be a float16 tensor [", a.k, ", ", a.n, "]");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, qweight, "qweight");
  return a;
}

inline AwqArgs check_awq_gemv_args(const Tensor& out, const Tensor& input, const Tensor& qweight,
                                   const Tensor& qzeros, const Tensor& scales) {
  const char* op = "awq_gemv";
  const AwqArgs a = check_awq_weights(op, qweight, qzeros, scales);
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half && input.dim() == 2 && input.size(1) == a.k, op,
                  ": 'input' must be a float16 tensor [M, ", a.k, "]");
  const int64_t m = input.size(0);
  VLLM_VOLTA_CHECK(m >= 1 && m <= kAwqMaxGemvRows, op, ": 'input' must have 1 to ", kAwqMaxGemvRows,
                  " rows, got ", m);
  check_contiguous(op, "input", input);
  check_same_device(op, "input", input, qweight, "qweight");
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2 && out.size(0) == m &&
                      out.size(1) == a.n, op, ": 'out' must be a float16 tensor [", m, ", ", a.n, "]");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, qweight, "qweight");
  return a;
}

}  // namespace vllm_volta
