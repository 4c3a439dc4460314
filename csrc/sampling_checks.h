// Argument validation of gumbel_sample and greedy_sample, shared by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

struct SampleArgs {
  int64_t rows;
  int64_t vocab;
  int64_t row_stride;
};

struct VecArg {
  const char* name;
  const Tensor& t;
  ScalarType dtype;
  const char* dtype_name;
};

// A 1-D per-row vector of `rows` entries of one dtype, contiguous, on the device of logits.
inline void check_row_vector(const char* op, const VecArg& v, int64_t rows, const Tensor& logits) {
  VLLM_VOLTA_CHECK(v.t.scalar_type() == v.dtype, op, ": '", v.name, "' must be ", v.dtype_name);
  VLLM_VOLTA_CHECK(v.t.dim() == 1 && v.t.size(0) == rows, op, ": '", v.name, "' must be 1-D with one entry per ",
                  "row of 'logits' (", rows, ")");
  VLLM_VOLTA_CHECK(v.t.is_contiguous(), op, ": '", v.name, "' must be contiguous");
  check_same_device(op, v.name, v.t, logits, "logits");
}

// greedy_sample: sampled [B] int64, logits [B, V] (float dtype, rows may be strided), workspace
// int64 with at least 2B entries, all zero (not checked: that would need a device sync; the
// kernel leaves them zero again).
inline SampleArgs check_sample_args(const char* op, const Tensor& sampled, const Tensor& logits,
                                    const Tensor& workspace) {
  check_float_dtype(op, "logits", logits);
  VLLM_VOLTA_CHECK(logits.dim() == 2, op, ": 'logits' must be [num_rows, vocab_size], got ", logits.dim(),
                  " dimension(s)");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  // < 2^30: the kernel indexes entries with 32-bit ints, up to a block span past the end.
  VLLM_VOLTA_CHECK(vocab >= 1 && vocab < (int64_t{1} << 30), op, ": vocab_size must be in [1, 2^30), got ", vocab);
  VLLM_VOLTA_CHECK(vocab == 1 || logits.stride(1) == 1, op, ": 'logits' must be contiguous in its last dimension");
  check_row_vector(op, {"sampled", sampled, ScalarType::Long, "int64"}, rows, logits);
  check_vector_1d(op, "workspace", workspace, ScalarType::Long, "int64");
  VLLM_VOLTA_CHECK(workspace.size(0) >= 2 * rows, op, ": 'workspace' must have at least 2 entries per row of ",
                  "'logits' (", 2 * rows, "), got ", workspace.size(0));
  check_same_device(op, "workspace", workspace, logits, "logits");
  return {rows, vocab, rows > 1 ? logits.stride(0) : vocab};
}

// sampled_host (optional): a contiguous 1-D int64 CPU tensor of one entry per row, which the kernel
// writes the ids into as well (it must be pinned: checked by the CUDA launcher).
inline void check_sampled_host(const char* op, const std::optional<Tensor>& sampled_host, int64_t rows) {
  if (!sampled_host.has_value()) return;
  const Tensor& h = *sampled_host;
  VLLM_VOLTA_CHECK(h.is_cpu(), op, ": 'sampled_host' must be a (pinned) CPU tensor");
  VLLM_VOLTA_CHECK(h.scalar_type() == ScalarType::Long && h.dim() == 1 && h.size(0) == rows && h.is_contiguous(),
                  op, ": 'sampled_host' must be a contiguous 1-D int64 tensor with one entry per row of 'logits' (",
                  rows, ")");
}

// gumbel_sample: as greedy_sample, plus temperature [B] float32 (> 0, not checked: that would
// need a device sync) and seeds [B] int64.
inline SampleArgs check_gumbel_sample_args(const Tensor& sampled, const Tensor& logits, const Tensor& temperature,
                                           const Tensor& seeds, const Tensor& workspace,
                                           const std::optional<Tensor>& sampled_host) {
  const char* op = "gumbel_sample";
  const SampleArgs a = check_sample_args(op, sampled, logits, workspace);
  check_row_vector(op, {"temperature", temperature, ScalarType::Float, "float32"}, a.rows, logits);
  check_row_vector(op, {"seeds", seeds, ScalarType::Long, "int64"}, a.rows, logits);
  check_sampled_host(op, sampled_host, a.rows);
  return a;
}

inline SampleArgs check_greedy_sample_args(const Tensor& sampled, const Tensor& logits, const Tensor& workspace,
                                           const std::optional<Tensor>& sampled_host) {
  const SampleArgs a = check_sample_args("greedy_sample", sampled, logits, workspace);
  check_sampled_host("greedy_sample", sampled_host, a.rows);
  return a;
}

}  // namespace vllm_volta
