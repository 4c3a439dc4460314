// Host launchers of gguf_gemv and gguf_dequantize (device code: kernels/gguf.cuh): GGUF weights
// kept in their blocks (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K), decoded in registers, so they run on SM70
// and newer. No host sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "gguf_checks.h"
#include "kernels/gguf.cuh"
#include "ops.h"

namespace vllm_volta {

static_assert(kGgufGemvMaxRows == kGgufMaxGemvRows, "host and kernel must agree on the gemv rows");
static_assert(kGgufGemvMaxRows == 8, "dispatch_rows_up_to_8 covers the gemv rows");

namespace {

// Calls f(TypeTag<Block>{}) for a GGML type id (checked before).
template <typename F>
void dispatch_gguf_type(int64_t qtype, F&& f) {
  switch (qtype) {
    case kGgmlQ4_0: return f(TypeTag<GgufQ4_0>{});
    case kGgmlQ8_0: return f(TypeTag<GgufQ8_0>{});
    case kGgmlQ4_K: return f(TypeTag<GgufQ4K>{});
    case kGgmlQ5_K: return f(TypeTag<GgufQ5K>{});
    default: return f(TypeTag<GgufQ6K>{});
  }
}

}  // namespace

void gguf_gemv(Tensor out, Tensor input, Tensor weight, int64_t qtype, std::optional<Tensor> bias) {
  const char* op = "gguf_gemv";
  const GgufWeightArgs a = check_gguf_gemv_args(out, input, weight, qtype, bias);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'input' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(weight);
  const int64_t m = input.size(0);
  dispatch_gguf_type(qtype, [&](auto type_tag) {
    using B = typename decltype(type_tag)::type;
    dispatch_rows_up_to_8(m, [&](auto m_tag) {
      constexpr int M = decltype(m_tag)::value;
      constexpr int R = gguf_rows_per_warp<M>();
      launch_kernel(gguf_gemv_kernel<M, R, B>, dim3(static_cast<unsigned>(ceil_div(a.n, kGgufGemvWarps * R))),
                    dim3(kGgufGemvWarps * 32), 0, stream, false, static_cast<__half*>(out.data_ptr()),
                    m > 1 ? out.stride(0) : a.n, static_cast<const __half*>(input.data_ptr()),
                    m > 1 ? input.stride(0) : a.k, static_cast<const uint8_t*>(weight.data_ptr()), a.row_bytes,
                    bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr, static_cast<int>(a.n),
                    static_cast<int>(a.k));
    });
  });
  check_launch(op);
}

void gguf_dequantize(Tensor out, Tensor weight, int64_t qtype) {
  const char* op = "gguf_dequantize";
  const GgufWeightArgs a = check_gguf_dequantize_args(out, weight, qtype);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(out.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'out' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t threads_total = a.n * ceil_div(a.k, kGgufStep) * 32;
  constexpr int kThreads = 256;
  dispatch_gguf_type(qtype, [&](auto type_tag) {
    using B = typename decltype(type_tag)::type;
    launch_kernel(gguf_dequantize_kernel<B>, dim3(static_cast<unsigned>(ceil_div(threads_total, kThreads))),
                  dim3(kThreads), 0, current_stream(weight), false, static_cast<__half*>(out.data_ptr()),
                  static_cast<const uint8_t*>(weight.data_ptr()), a.row_bytes, static_cast<int>(a.n),
                  static_cast<int>(a.k));
  });
  check_launch(op);
}

}  // namespace vllm_volta
