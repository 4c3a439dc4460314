// Argument validation of the W4A16 ops on the K-major 4-bit layout (kernels/w4.cuh), shared by
// the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

namespace vllm_volta {

constexpr int64_t kW4MaxGemvRowsHost = 8;  // kW4MaxGemvRows in kernels/w4.cuh

struct W4Args {
  int64_t k;            // input features
  int64_t n;            // output features
  int64_t groups;
  int group_shift;      // chunk c (32 k values) is in group c >> group_shift
};

// qweight int32 [N, K / 8], sz float16 [N, G, 2]; K % 32 == 0, K / G = 32 * 2**e or G = 1.
inline W4Args check_w4_weights(const char* op, const Tensor& qweight, const Tensor& sz) {
  VLLM_VOLTA_CHECK(qweight.scalar_type() == ScalarType::Int && qweight.dim() == 2, op,
                  ": 'qweight' must be a 2-D int32 tensor [N, K / 8]");
  VLLM_VOLTA_CHECK(sz.scalar_type() == ScalarType::Half && sz.dim() == 3 && sz.size(2) == 2, op,
                  ": 'sz' must be a 3-D float16 tensor [N, groups, 2]");
  check_same_device(op, "sz", sz, qweight, "qweight");
  check_contiguous(op, "qweight", qweight);
  check_contiguous(op, "sz", sz);
  const int64_t n = qweight.size(0), k = qweight.size(1) * 8, groups = sz.size(1);
  VLLM_VOLTA_CHECK(n > 0 && k > 0 && k % 32 == 0, op, ": 'qweight' must be [N, K / 8] with K a positive multiple of 32, got K = ", k);
  VLLM_VOLTA_CHECK(sz.size(0) == n && groups > 0 && k % groups == 0, op, ": 'sz' must be [", n,
                  ", groups, 2] with groups dividing K = ", k, ", got [", sz.size(0), ", ", groups, ", 2]");
  const int64_t chunks_per_group = k / groups / 32;
  int shift = 31;
  if (groups > 1) {
    VLLM_VOLTA_CHECK((k / groups) % 32 == 0 && (chunks_per_group & (chunks_per_group - 1)) == 0, op,
                    ": the group size K / groups = ", k / groups, " must be 32 times a power of two (or one group)");
    shift = 0;
    while ((int64_t{1} << shift) < chunks_per_group) ++shift;
  }
  VLLM_VOLTA_CHECK(k < (int64_t{1} << 31) && n < (int64_t{1} << 31), op, ": K and N must be below 2**31");
  return {k, n, groups, shift};
}

inline void check_w4_io(const char* op, const W4Args& a, const Tensor& out, const Tensor& input,
                        const Tensor& qweight) {
  VLLM_VOLTA_CHECK(input.scalar_type() == ScalarType::Half && input.dim() == 2 && input.size(1) == a.k, op,
                  ": 'input' must be a float16 tensor [M, ", a.k, "]");
  check_contiguous(op, "input", input);
  check_same_device(op, "input", input, qweight, "qweight");
  const int64_t m = input.size(0);
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2 && out.size(0) == m &&
                      out.size(1) == a.n, op, ": 'out' must be a float16 tensor [", m, ", ", a.n, "]");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, qweight, "qweight");
}

inline W4Args check_w4_gemv_args(const Tensor& out, const Tensor& input, const Tensor& qweight, const Tensor& sz,
                                 int64_t rows_per_warp) {
  const char* op = "w4_gemv";
  const W4Args a = check_w4_weights(op, qweight, sz);
  check_w4_io(op, a, out, input, qweight);
  const int64_t m = input.size(0);
  VLLM_VOLTA_CHECK(m >= 1 && m <= kW4MaxGemvRowsHost, op, ": 'input' must have 1 to ", kW4MaxGemvRowsHost,
                  " rows, got ", m);
  VLLM_VOLTA_CHECK(rows_per_warp == 1 || rows_per_warp == 2 || rows_per_warp == 4, op,
                  ": 'rows_per_warp' must be 1, 2 or 4, got ", rows_per_warp);
  VLLM_VOLTA_CHECK(m <= 4 || rows_per_warp <= 2, op, ": 'rows_per_warp' must be 1 or 2 above 4 input rows, got ",
                  rows_per_warp);
  return a;
}

inline W4Args check_w4_gemm_args(const Tensor& out, const Tensor& input, const Tensor& qweight, const Tensor& sz,
                                 int64_t block_m, int64_t block_n, int64_t splits) {
  const char* op = "w4_gemm";
  const W4Args a = check_w4_weights(op, qweight, sz);
  check_w4_io(op, a, out, input, qweight);
  VLLM_VOLTA_CHECK(input.size(0) >= 1, op, ": 'input' must have at least one row");
  VLLM_VOLTA_CHECK(block_m == 16 || block_m == 32 || block_m == 64, op, ": 'block_m' must be 16, 32 or 64, got ",
                  block_m);
  VLLM_VOLTA_CHECK(block_n == 32 || block_n == 64 || block_n == 128, op,
                  ": 'block_n' must be 32, 64 or 128, got ", block_n);
  VLLM_VOLTA_CHECK(!(block_m == 16 && block_n == 32), op, ": 'block_m' 16 needs 'block_n' 64 or 128");
  VLLM_VOLTA_CHECK(splits >= 1 && splits <= 64, op, ": 'splits' must be 1 to 64, got ", splits);
  return a;
}

inline W4Args check_w4_dequantize_args(const Tensor& out, const Tensor& qweight, const Tensor& sz) {
  const char* op = "w4_dequantize";
  const W4Args a = check_w4_weights(op, qweight, sz);
  VLLM_VOLTA_CHECK(out.scalar_type() == ScalarType::Half && out.dim() == 2 && out.size(0) == a.n &&
                      out.size(1) == a.k, op, ": 'out' must be a float16 tensor [", a.n, ", ", a.k, "] (W transposed)");
  check_contiguous(op, "out", out);
  check_same_device(op, "out", out, qweight, "qweight");
  return a;
}

}  // namespace vllm_volta
