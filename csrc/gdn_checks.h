// Argument validation of the Gated DeltaNet ops (gated_delta_rule_decode / _prefill,
// causal_conv1d_update / _fn), shared by the CUDA launchers and the Meta kernels.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

constexpr int64_t kGdnMaxHeadDim = 256;  // Dk the recurrence kernel keeps in registers
constexpr int64_t kConvMinWidth = 2;
constexpr int64_t kConvMaxWidth = 4;

struct GdnArgs {
  int64_t tokens;  // N
  int64_t seqs;    // B
  int64_t num_k_heads, num_v_heads, dk, dv, num_slots;
  int64_t q_stride, k_stride, v_stride, a_stride, b_stride;
};

namespace detail {
// A [N, H, D] tensor whose heads are packed in each token row (row stride free).
inline int64_t check_heads_3d(const char* op, const char* arg, const Tensor& t) {
  VLLM_VOLTA_CHECK(t.dim() == 3, op, ": '", arg, "' must be 3-D [tokens, heads, head_dim]");
  VLLM_VOLTA_CHECK((t.size(2) <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == t.size(2)), op,
                  ": '", arg, "' must have its heads packed in each token row (strides [*, head_dim, 1])");
  return t.size(0) <= 1 ? t.size(1) * t.size(2) : t.stride(0);
}

// A [N, H] tensor of per-(token, head) scalars, heads contiguous; returns the row stride.
inline int64_t check_gate_2d(const char* op, const char* arg, const Tensor& t, int64_t n, int64_t h) {
  check_float_dtype(op, arg, t);
  VLLM_VOLTA_CHECK(t.dim() == 2 && t.size(0) == n && t.size(1) == h, op, ": '", arg, "' must be [", n, ", ", h,
                  "] (tokens, value heads)");
  VLLM_VOLTA_CHECK(h <= 1 || t.stride(1) == 1, op, ": '", arg, "' must be contiguous in its last dimension");
  return n <= 1 ? h : t.stride(0);
}

inline void check_int32_vector(const char* op, const char* arg, const Tensor& t, int64_t n) {
  check_vector_1d(op, arg, t, ScalarType::Int, "int32");
  VLLM_VOLTA_CHECK(t.size(0) == n, op, ": '", arg, "' must have ", n, " entries, got ", t.size(0));
}

inline void check_bool_vector(const char* op, const char* arg, const Tensor& t, int64_t n) {
  check_vector_1d(op, arg, t, ScalarType::Bool, "bool");
  VLLM_VOLTA_CHECK(t.size(0) == n, op, ": '", arg, "' must have ", n, " entries, got ", t.size(0));
}
}  // namespace detail

// q, k [N, Hk, Dk]; v, out [N, Hv, Dv] (q / k / v token rows may be strided, e.g. views of the
// conv output; out contiguous), one dtype; a, b [N, Hv] any float dtype; state [num_slots, Hv,
// Dk, Dv] contiguous, float32 or q's dtype; state_slots [B] int32. Decode: N == B (no
// query_start_loc); prefill: query_start_loc [B + 1] int32, has_initial_state [B] bool optional.
// A_log and dt_bias ([Hv], any float dtype) come together or not at all.
inline GdnArgs check_gated_delta_rule_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& a, const Tensor& b, const Tensor& state,
                                           const Tensor& state_slots, const std::optional<Tensor>& query_start_loc,
                                           const std::optional<Tensor>& has_initial_state, double scale,
                                           const std::optional<Tensor>& A_log, const std::optional<Tensor>& dt_bias) {
  using namespace detail;
  check_float_dtype(op, "q", q);
  check_same_dtype(op, "k", k, q, "q");
  check_same_dtype(op, "v", v, q, "q");
  check_same_dtype(op, "out", out, q, "q");
  GdnArgs r{};
  r.q_stride = check_heads_3d(op, "q", q);
  r.k_stride = check_heads_3d(op, "k", k);
  r.v_stride = check_heads_3d(op, "v", v);
  check_same_shape(op, "k", k, q, "q");
  r.tokens = q.size(0);
  r.num_k_heads = q.size(1);
  r.dk = q.size(2);
  r.num_v_heads = v.size(1);
  r.dv = v.size(2);
  VLLM_VOLTA_CHECK(v.size(0) == r.tokens, op, ": 'v' must have as many tokens as 'q' (", r.tokens, ")");
  VLLM_VOLTA_CHECK(r.num_k_heads >= 1 && r.num_v_heads % r.num_k_heads == 0, op, ": the value heads of 'v' (",
                  r.num_v_heads, ") must be a multiple of the key heads of 'q' / 'k' (", r.num_k_heads, ")");
  VLLM_VOLTA_CHECK(r.dk >= 1 && r.dk <= kGdnMaxHeadDim, op, ": the key head dim of 'q' / 'k' must be in [1, ",
                  kGdnMaxHeadDim, "], got ", r.dk);
  VLLM_VOLTA_CHECK(r.dv >= 1, op, ": the value head dim of 'v' must be >= 1");
  check_same_shape(op, "out", out, v, "v");
  check_contiguous(op, "out", out);
  r.a_stride = check_gate_2d(op, "a", a, r.tokens, r.num_v_heads);
  r.b_stride = check_gate_2d(op, "b", b, r.tokens, r.num_v_heads);

  VLLM_VOLTA_CHECK(state.scalar_type() == ScalarType::Float || state.scalar_type() == q.scalar_type(), op,
                  ": 'state' must be float32 or the dtype of 'q' (", dtype_name(q.scalar_type()), "), got ",
                  dtype_name(state.scalar_type()));
  VLLM_VOLTA_CHECK(state.dim() == 4 && state.size(1) == r.num_v_heads && state.size(2) == r.dk &&
                      state.size(3) == r.dv,
                  op, ": 'state' must be [num_slots, ", r.num_v_heads, ", ", r.dk, ", ", r.dv,
                  "] (slots, value heads, key head dim, value head dim)");
  check_contiguous(op, "state", state);
  r.num_slots = state.size(0);

  check_vector_1d(op, "state_slots", state_slots, ScalarType::Int, "int32");
  r.seqs = state_slots.size(0);
  if (query_start_loc.has_value()) {
    check_int32_vector(op, "query_start_loc", *query_start_loc, r.seqs + 1);
    check_same_device(op, "query_start_loc", *query_start_loc, q, "q");
  } else {
    VLLM_VOLTA_CHECK(r.seqs == r.tokens, op, ": 'state_slots' must have one entry per token row of 'q' (",
                    r.tokens, "), got ", r.seqs);
  }
  if (has_initial_state.has_value()) {
    check_bool_vector(op, "has_initial_state", *has_initial_state, r.seqs);
    check_same_device(op, "has_initial_state", *has_initial_state, q, "q");
  }
  VLLM_VOLTA_CHECK(scale > 0.0, op, ": 'scale' must be > 0, got ", scale);
  VLLM_VOLTA_CHECK(A_log.has_value() == dt_bias.has_value(), op,
                  ": 'A_log' and 'dt_bias' must be given together (fused gates) or both omitted");
  const std::optional<Tensor>* params[] = {&A_log, &dt_bias};
  const char* names[] = {"A_log", "dt_bias"};
  for (int i = 0; i < 2; ++i) {
    if (!params[i]->has_value()) continue;
    const Tensor& t = **params[i];
    check_float_dtype(op, names[i], t);
    VLLM_VOLTA_CHECK(t.dim() == 1 && t.size(0) == r.num_v_heads && t.is_contiguous(), op, ": '", names[i],
                    "' must be a contiguous 1-D tensor of ", r.num_v_heads, " entries (value heads)");
    check_same_device(op, names[i], t, q, "q");
  }
  const Tensor* same[] = {&k, &v, &out, &a, &b, &state, &state_slots};
  const char* same_names[] = {"k", "v", "out", "a", "b", "state", "state_slots"};
  for (int i = 0; i < 7; ++i) check_same_device(op, same_names[i], *same[i], q, "q");
  return r;
}

struct ConvArgs {
  int64_t tokens, seqs, channels, width, num_slots;
  int64_t x_stride;
  int64_t st_slot, st_chan, st_pos;
};

// x [N, C] (token rows may be strided), out [N, C] contiguous, weight [C, W] contiguous with
// 2 <= W <= 4, bias [C] optional, conv_state [num_slots, C, W - 1] (any strides), one dtype;
// state_slots [B] int32; decode: N == B; prefill: query_start_loc [B + 1] int32 and
// has_initial_state [B] bool optional.
inline ConvArgs check_causal_conv1d_args(const char* op, const Tensor& out, const Tensor& x, const Tensor& weight,
                                         const std::optional<Tensor>& bias, const Tensor& conv_state,
                                         const Tensor& state_slots, const std::optional<Tensor>& query_start_loc,
                                         const std::optional<Tensor>& has_initial_state) {
  using namespace detail;
  check_float_dtype(op, "x", x);
  check_same_dtype(op, "out", out, x, "x");
  check_same_dtype(op, "weight", weight, x, "x");
  check_same_dtype(op, "conv_state", conv_state, x, "x");
  VLLM_VOLTA_CHECK(x.dim() == 2, op, ": 'x' must be 2-D [tokens, channels]");
  ConvArgs r{};
  r.tokens = x.size(0);
  r.channels = x.size(1);
  r.x_stride = row_layout(op, "x", x).row_stride;
  check_same_shape(op, "out", out, x, "x");
  check_contiguous(op, "out", out);
  VLLM_VOLTA_CHECK(weight.dim() == 2 && weight.size(0) == r.channels && weight.is_contiguous(), op,
                  ": 'weight' must be a contiguous [", r.channels, ", kernel_size] tensor");
  r.width = weight.size(1);
  VLLM_VOLTA_CHECK(r.width >= kConvMinWidth && r.width <= kConvMaxWidth, op, ": the kernel size (columns of 'weight') must be in [",
                  kConvMinWidth, ", ", kConvMaxWidth, "], got ", r.width);
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, x, "x");
    VLLM_VOLTA_CHECK(bias->dim() == 1 && bias->size(0) == r.channels && bias->is_contiguous(), op,
                    ": 'bias' must be a contiguous 1-D tensor of ", r.channels, " entries");
    check_same_device(op, "bias", *bias, x, "x");
  }
  VLLM_VOLTA_CHECK(conv_state.dim() == 3 && conv_state.size(1) == r.channels && conv_state.size(2) == r.width - 1,
                  op, ": 'conv_state' must be [num_slots, ", r.channels, ", ", r.width - 1,
                  "] (slots, channels, kernel_size - 1)");
  r.num_slots = conv_state.size(0);
  r.st_slot = conv_state.stride(0);
  r.st_chan = conv_state.stride(1);
  r.st_pos = conv_state.stride(2);
  check_vector_1d(op, "state_slots", state_slots, ScalarType::Int, "int32");
  r.seqs = state_slots.size(0);
  if (query_start_loc.has_value()) {
    check_int32_vector(op, "query_start_loc", *query_start_loc, r.seqs + 1);
    check_same_device(op, "query_start_loc", *query_start_loc, x, "x");
  } else {
    VLLM_VOLTA_CHECK(r.seqs == r.tokens, op, ": 'state_slots' must have one entry per token row of 'x' (", r.tokens,
                    "), got ", r.seqs);
  }
  if (has_initial_state.has_value()) {
    check_bool_vector(op, "has_initial_state", *has_initial_state, r.seqs);
    check_same_device(op, "has_initial_state", *has_initial_state, x, "x");
  }
  const Tensor* same[] = {&out, &weight, &conv_state, &state_slots};
  const char* same_names[] = {"out", "weight", "conv_state", "state_slots"};
  for (int i = 0; i < 4; ++i) check_same_device(op, same_names[i], *same[i], x, "x");
  return r;
}

// gated_rms_norm(out, x, gate, weight, epsilon): x / gate / out [N, heads * dim] (rows may be
// strided, each row contiguous), weight [dim]; the norm runs over each head's dim entries.
struct GatedNormArgs {
  int64_t tokens, width, dim;
  int64_t out_stride, x_stride, gate_stride;
};

inline GatedNormArgs check_gated_rms_norm_args(const Tensor& out, const Tensor& x, const Tensor& gate,
                                               const Tensor& weight, double epsilon) {
  const char* op = "gated_rms_norm";
  check_float_dtype(op, "x", x);
  check_epsilon(op, epsilon);
  const Tensor* rows[] = {&out, &x, &gate};
  const char* names[] = {"out", "x", "gate"};
  RowLayout layouts[3];
  for (int i = 0; i < 3; ++i)
    VLLM_VOLTA_CHECK(rows[i]->dim() == 2, op, ": '", names[i], "' must be 2-D [tokens, heads * dim], got ",
                    rows[i]->dim(), " dimensions");
  for (int i = 0; i < 3; ++i) {
    check_same_dtype(op, names[i], *rows[i], x, "x");
    check_same_device(op, names[i], *rows[i], x, "x");
    check_same_shape(op, names[i], *rows[i], x, "x");
    layouts[i] = row_layout(op, names[i], *rows[i]);
  }
  check_vector_1d(op, "weight", weight, x.scalar_type(), dtype_name(x.scalar_type()));
  check_same_device(op, "weight", weight, x, "x");
  GatedNormArgs r{x.size(0), x.size(1), weight.size(0), layouts[0].row_stride, layouts[1].row_stride,
                  layouts[2].row_stride};
  VLLM_VOLTA_CHECK(r.dim > 0 && r.width % r.dim == 0, op, ": the rows' width ", r.width,
                  " must be a multiple of 'weight''s size ", r.dim, " (heads x dim)");
  return r;
}

}  // namespace vllm_volta
