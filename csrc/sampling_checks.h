// Argument validation of gumbel_sample, shared by the CUDA launcher and the Meta kernel.
#pragma once

#include "op_checks.h"

#include <cstdint>

namespace vllm_volta {

struct GumbelSampleArgs {
  int64_t rows;
  int64_t vocab;
  int64_t row_stride;
};

// sampled [B] int64, logits [B, V] (float dtype, rows may be strided), temperature [B] float32
// (> 0, not checked: that would need a device sync), seeds [B] int64; all on one device.
inline GumbelSampleArgs check_gumbel_sample_args(const Tensor& sampled, const Tensor& logits,
                                                 const Tensor& temperature, const Tensor& seeds) {
  const char* op = "gumbel_sample";
  check_float_dtype(op, "logits", logits);
  VLLM_VOLTA_CHECK(logits.dim() == 2, op, ": 'logits' must be [num_rows, vocab_size], got ", logits.dim(),
                  " dimension(s)");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  VLLM_VOLTA_CHECK(vocab >= 1 && vocab < (int64_t{1} << 31), op, ": vocab_size must be in [1, 2^31), got ", vocab);
  VLLM_VOLTA_CHECK(vocab == 1 || logits.stride(1) == 1, op, ": 'logits' must be contiguous in its last dimension");
  struct Vec {
    const char* name;
    const Tensor& t;
    ScalarType dtype;
    const char* dtype_name;
  };
  for (const Vec& v : {Vec{"sampled", sampled, ScalarType::Long, "int64"},
                       Vec{"temperature", temperature, ScalarType::Float, "float32"},
                       Vec{"seeds", seeds, ScalarType::Long, "int64"}}) {
    VLLM_VOLTA_CHECK(v.t.scalar_type() == v.dtype, op, ": '", v.name, "' must be ", v.dtype_name);
    VLLM_VOLTA_CHECK(v.t.dim() == 1 && v.t.size(0) == rows, op, ": '", v.name, "' must be 1-D with one entry per ",
                    "row of 'logits' (", rows, ")");
    VLLM_VOLTA_CHECK(v.t.is_contiguous(), op, ": '", v.name, "' must be contiguous");
    check_same_device(op, v.name, v.t, logits, "logits");
  }
  return {rows, vocab, rows > 1 ? logits.stride(0) : vocab};
}

}  // namespace vllm_volta
