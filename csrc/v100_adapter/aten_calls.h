// The few ATen ops the V100 adapter needs that torch/csrc/stable/ops.h does not wrap,
// called through the stable dispatcher (torch_call_dispatcher). The dispatcher picks
// the device kernel, so every function here works for CPU and CUDA tensors alike.
// (Ops taking a Scalar cannot be boxed as StableIValue; none of these does.)
#pragma once

#include <torch/csrc/stable/c/shim.h>
#include <torch/headeronly/util/shim_utils.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace vllm_volta::aten {

using torch::stable::Tensor;
using torch::stable::detail::from;
using torch::stable::detail::to;

template <size_t N>
inline void call(const char* op, const char* overload, std::array<StableIValue, N>& stack) {
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(op, overload, stack.data(), TORCH_ABI_VERSION));
}

// x / (1 + exp(-x)), computed in fp32 for reduced-precision inputs.
inline Tensor silu(const Tensor& x) {
  std::array<StableIValue, 1> stack{from(x)};
  call("aten::silu", "", stack);
  return to<Tensor>(stack[0]);
}

// approximate: "none" (erf) or "tanh".
inline Tensor gelu(const Tensor& x, const std::string& approximate) {
  std::array<StableIValue, 2> stack{from(x), from(approximate)};
  call("aten::gelu", "", stack);
  return to<Tensor>(stack[0]);
}

// out <- a * b (broadcasting), written in place into `out` without a temporary.
inline void mul_out(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::array<StableIValue, 3> stack{from(a), from(b), from(out)};
  call("aten::mul", "out", stack);
  (void)to<Tensor>(stack[0]);  // release the returned reference to `out`
}

// weight * x * rsqrt(mean(x^2, -1) + eps): fp32 statistics, the weight applied in fp32 and
// the result rounded once to x's dtype (HF / vLLM round x * rsqrt first, then multiply in the
// dtype; the two can differ in the last bit). One kernel, no broadcast multiply.
inline Tensor fused_rms_norm(const Tensor& x, const Tensor& weight, double epsilon) {
  const std::vector<int64_t> normalized_shape{x.size(-1)};
  std::array<StableIValue, 4> stack{from(x), from(normalized_shape),
                                    from(std::optional<Tensor>(weight)), from(std::optional<double>(epsilon))};
  call("aten::_fused_rms_norm", "", stack);
  (void)to<Tensor>(stack[1]);  // rstd: not needed, free it
  return to<Tensor>(stack[0]);
}

}  // namespace vllm_volta::aten
