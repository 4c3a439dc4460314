// Host launchers for the native gated-activation kernels (device code: kernels/activation.cuh).
#include "cuda_launch.h"
#include "kernels/activation.cuh"
#include "ops.h"

#include <algorithm>
#include <limits>

namespace vllm_volta {

namespace {

template <Activation A>
void launch_act_and_mul(const char* op, const char* out_arg, const Tensor& out, const Tensor& input) {
  const RowLayout rows = check_act_and_mul_args(op, out_arg, out, input);
  check_cuda(op, "input", input);
  const int64_t d = rows.hidden / 2;
  if (rows.rows == 0 || d == 0) return;
  VLLM_VOLTA_CHECK(rows.hidden <= std::numeric_limits<int>::max() && rows.rows <= std::numeric_limits<int>::max(),
                  op, ": 'input' is too large (rows and hidden size must fit in int32)");
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  dispatch_float_type(op, input, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    const int width = pick_vec_width(sizeof(T), {out.data_ptr(), input.data_ptr()}, {d, rows.row_stride});
    dispatch_vec_width<T>(width, [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const int64_t num_vecs = d / VEC;
      const int threads = static_cast<int>(std::min<int64_t>(256, round_up(static_cast<int>(std::min<int64_t>(num_vecs, 256)), 32)));
      // Split long rows over grid.y so few-token calls (decode) still fill the GPU.
      const unsigned chunks = static_cast<unsigned>(std::min<int64_t>((num_vecs + threads - 1) / threads, 65535));
      const dim3 grid(static_cast<unsigned>(rows.rows), chunks);
      act_and_mul_kernel<T, VEC, A><<<grid, threads, 0, stream>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(input.data_ptr()), rows.row_stride,
          static_cast<int>(d));
    });
  });
  check_launch(op);
}

}  // namespace

void native_silu_and_mul(Tensor result, Tensor input) {
  launch_act_and_mul<Activation::kSilu>("silu_and_mul", "result", result, input);
}

void native_gelu_and_mul(Tensor out, Tensor input) {
  launch_act_and_mul<Activation::kGelu>("gelu_and_mul", "out", out, input);
}

void native_gelu_tanh_and_mul(Tensor out, Tensor input) {
  launch_act_and_mul<Activation::kGeluTanh>("gelu_tanh_and_mul", "out", out, input);
}

}  // namespace vllm_volta
