// Argument validation shared by every implementation of an op (native CUDA kernel,
// V100 adapter, CPU, Meta), so bad input fails the same way on every device: a
// std::runtime_error naming the op and the argument, never a crash.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace vllm_volta {

namespace detail {
inline void append(std::string& msg, const char* part) { msg += part; }
inline void append(std::string& msg, const std::string& part) { msg += part; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
inline void append(std::string& msg, T part) {
  msg += std::to_string(part);
}

// Messages are concatenated without iostreams: on an H200 image the module's ostream
// number formatting crashed (a static libstdc++ copy inside the module), taking the error
// path down with it. std::to_string goes through vsnprintf instead.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string msg;
  (append(msg, parts), ...);
  throw std::runtime_error(msg);
}
}  // namespace detail

}  // namespace vllm_volta

// Like STD_TORCH_CHECK: throws std::runtime_error (Python RuntimeError) with the parts
// concatenated; callers start the message with "<op>: '<argument>' ...".
#define VLLM_VOLTA_CHECK(cond, ...)                              \
  do {                                                           \
    if (!(cond)) ::vllm_volta::detail::fail(__VA_ARGS__);        \
  } while (0)

namespace vllm_volta {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

// A tensor seen as `rows` rows of `hidden` contiguous elements, `row_stride` apart.
struct RowLayout {
  int64_t rows;
  int64_t hidden;
  int64_t row_stride;
};

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    default: return "an unsupported dtype";
  }
}

inline void check_float_dtype(const char* op, const char* arg, const Tensor& t) {
  const ScalarType s = t.scalar_type();
  VLLM_VOLTA_CHECK(s == ScalarType::Float || s == ScalarType::Half || s == ScalarType::BFloat16,
                  op, ": '", arg, "' must be float32, float16 or bfloat16, got ", dtype_name(s));
}

inline void check_same_dtype(const char* op, const char* arg, const Tensor& t, const Tensor& ref,
                             const char* ref_arg) {
  VLLM_VOLTA_CHECK(t.scalar_type() == ref.scalar_type(), op, ": '", arg, "' has dtype ",
                  dtype_name(t.scalar_type()), " but '", ref_arg, "' has ",
                  dtype_name(ref.scalar_type()), "; they must match");
}

inline void check_same_device(const char* op, const char* arg, const Tensor& t, const Tensor& ref,
                              const char* ref_arg) {
  VLLM_VOLTA_CHECK(t.is_cuda() == ref.is_cuda() && t.is_cpu() == ref.is_cpu() &&
                      t.get_device_index() == ref.get_device_index(),
                  op, ": '", arg, "' and '", ref_arg, "' must be on the same device");
}

inline void check_same_shape(const char* op, const char* arg, const Tensor& t, const Tensor& ref,
                             const char* ref_arg) {
  bool same = t.dim() == ref.dim();
  for (int64_t d = 0; same && d < t.dim(); ++d) same = t.size(d) == ref.size(d);
  VLLM_VOLTA_CHECK(same, op, ": '", arg, "' must have the same shape as '", ref_arg, "'");
}

inline void check_contiguous(const char* op, const char* arg, const Tensor& t) {
  VLLM_VOLTA_CHECK(t.is_contiguous(), op, ": '", arg, "' must be contiguous");
}

// Rows of `t`: the last dim must be contiguous and all leading dims must collapse into
// one uniform row stride (e.g. a slice x[:, :hidden] of a wider buffer is fine).
inline RowLayout row_layout(const char* op, const char* arg, const Tensor& t) {
  VLLM_VOLTA_CHECK(t.dim() >= 1, op, ": '", arg, "' must have at least 1 dimension");
  const int64_t hidden = t.size(-1);
  VLLM_VOLTA_CHECK(hidden <= 1 || t.stride(-1) == 1, op, ": '", arg,
                  "' must be contiguous in its last dimension (stride ", t.stride(-1), ")");
  RowLayout layout{1, hidden, hidden};
  int64_t expected = -1;  // stride the next outer non-trivial dim must have
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    const int64_t size = t.size(d);
    if (size == 1) continue;
    if (expected < 0) {
      layout.row_stride = t.stride(d);
    } else {
      VLLM_VOLTA_CHECK(t.stride(d) == expected, op, ": '", arg,
                      "' rows must be evenly strided (its leading dims cannot be flattened)");
    }
    layout.rows *= size;
    expected = t.stride(d) * size;
  }
  return layout;
}

// A contiguous 1-D tensor of `dtype` (`dtype_str` names it in the message).
inline void check_vector_1d(const char* op, const char* arg, const Tensor& t, ScalarType dtype,
                            const char* dtype_str) {
  VLLM_VOLTA_CHECK(t.scalar_type() == dtype && t.dim() == 1 && t.is_contiguous(), op, ": '", arg,
                  "' must be a contiguous 1-D ", dtype_str, " tensor");
}

inline void check_epsilon(const char* op, double epsilon) {
  VLLM_VOLTA_CHECK(epsilon >= 0.0, op, ": 'epsilon' must be >= 0, got ", epsilon);
}

// rms_norm(result, input, weight, eps) / fused_add_rms_norm(input, residual, weight, eps):
// `input` may have strided rows; `out_arg` (result / residual) must be contiguous.
inline RowLayout check_norm_args(const char* op, const char* out_arg, const Tensor& out,
                                 const char* in_arg, const Tensor& input, const Tensor& weight,
                                 double epsilon) {
  check_float_dtype(op, in_arg, input);
  check_same_dtype(op, out_arg, out, input, in_arg);
  check_same_dtype(op, "weight", weight, input, in_arg);
  check_same_device(op, out_arg, out, input, in_arg);
  check_same_device(op, "weight", weight, input, in_arg);
  check_same_shape(op, out_arg, out, input, in_arg);
  check_contiguous(op, out_arg, out);
  const RowLayout layout = row_layout(op, in_arg, input);
  VLLM_VOLTA_CHECK(weight.dim() == 1 && weight.size(0) == layout.hidden, op,
                  ": 'weight' must be 1-D of size hidden_size=", layout.hidden);
  VLLM_VOLTA_CHECK(weight.is_contiguous(), op, ": 'weight' must be contiguous");
  check_epsilon(op, epsilon);
  return layout;
}

// *_and_mul(out, input): input [..., 2*d] -> out [..., d]. `out_arg` is the schema's
// name for the output ("result" for silu_and_mul, "out" for the gelu variants).
inline RowLayout check_act_and_mul_args(const char* op, const char* out_arg, const Tensor& out,
                                        const Tensor& input) {
  check_float_dtype(op, "input", input);
  check_same_dtype(op, out_arg, out, input, "input");
  check_same_device(op, out_arg, out, input, "input");
  const RowLayout layout = row_layout(op, "input", input);
  VLLM_VOLTA_CHECK(layout.hidden % 2 == 0, op, ": last dim of 'input' must be even (2 * d), got ",
                  layout.hidden);
  bool shape_ok = out.dim() == input.dim() && out.size(-1) == layout.hidden / 2;
  for (int64_t d = 0; shape_ok && d + 1 < input.dim(); ++d) shape_ok = out.size(d) == input.size(d);
  VLLM_VOLTA_CHECK(shape_ok, op, ": '", out_arg, "' must have the shape of 'input' with last dim ",
                  layout.hidden / 2);
  check_contiguous(op, out_arg, out);
  return layout;
}

}  // namespace vllm_volta
