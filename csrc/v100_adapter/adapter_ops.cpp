// The V100 adapter: rms_norm / fused_add_rms_norm / *_and_mul composed from
// torch::stable ops and the stable dispatcher only (no kernels of our own).
// Registered for CUDA when every target arch is < 8.0 (VLLM_V100_ADAPTER), and for
// CPU in every build (csrc/torch_bindings.cpp).
#include "ops.h"
#include "op_checks.h"
#include "v100_adapter/aten_calls.h"

#include <torch/csrc/stable/ops.h>

namespace vllm_volta {

namespace {

// Ops run on empty tensors too, but there is nothing to compute.
bool is_empty(const Tensor& t) { return t.numel() == 0; }

void act_and_mul(const char* op, const char* out_arg, Tensor out, Tensor input, const char* gelu_approx) {
  const RowLayout layout = check_act_and_mul_args(op, out_arg, out, input);
  if (is_empty(input)) return;
  const int64_t d = layout.hidden / 2;
  const Tensor gate = torch::stable::narrow(input, -1, 0, d);
  const Tensor up = torch::stable::narrow(input, -1, d, d);
  // Activation rounded to the input dtype, then multiplied in that dtype (vLLM's order).
  const Tensor act = gelu_approx == nullptr ? aten::silu(gate) : aten::gelu(gate, gelu_approx);
  aten::mul_out(act, up, out);
}

}  // namespace

void adapter_rms_norm(Tensor result, Tensor input, Tensor weight, double epsilon) {
  check_norm_args("rms_norm", "result", result, "input", input, weight, epsilon);
  if (is_empty(input)) return;
  torch::stable::copy_(result, aten::fused_rms_norm(input, weight, epsilon));
}

void adapter_fused_add_rms_norm(Tensor input, Tensor residual, Tensor weight, double epsilon) {
  check_norm_args("fused_add_rms_norm", "residual", residual, "input", input, weight, epsilon);
  if (is_empty(input)) return;
  // residual <- input + residual. aten::add carries a Scalar alpha, which the stable
  // dispatcher cannot box; subtract(a, b, alpha=-1) is the stable-ABI spelling of a + b.
  const Tensor sum = torch::stable::subtract(residual, input, -1.0);
  torch::stable::copy_(input, aten::fused_rms_norm(sum, weight, epsilon));
  torch::stable::copy_(residual, sum);
}

void adapter_silu_and_mul(Tensor result, Tensor input) {
  act_and_mul("silu_and_mul", "result", result, input, nullptr);
}

void adapter_gelu_and_mul(Tensor out, Tensor input) {
  act_and_mul("gelu_and_mul", "out", out, input, "none");
}

void adapter_gelu_tanh_and_mul(Tensor out, Tensor input) {
  act_and_mul("gelu_tanh_and_mul", "out", out, input, "tanh");
}

}  // namespace vllm_volta
