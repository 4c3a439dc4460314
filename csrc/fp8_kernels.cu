// Host launchers of fp8_gemv and fp8_dequantize (device code: kernels/fp8_gemv.cuh): FP8 weights
// kept in FP8 and converted with integer operations, so they run on SM70 and newer. No host
// sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "fp8_checks.h"
#include "kernels/fp8_gemv.cuh"
#include "ops.h"

namespace vllm_volta {

static_assert(kFp8GemvMaxRows == kFp8MaxGemvRows, "host and kernel must agree on the gemv rows");

namespace {

// Threads per block: the fewest whole warps that give every thread a vector of the row (K = 4096:
// 256 vectors, 256 threads), at most kFp8GemvThreads.
int fp8_gemv_threads(int64_t k) {
  const int64_t vectors = k / kFp8VecWeights;
  return vectors >= kFp8GemvThreads ? kFp8GemvThreads : round_up(static_cast<int>(vectors), 32);
}

// Calls f(IntTag<M>{}) for 1 <= M <= kFp8GemvMaxRows (checked before).
template <typename F>
void dispatch_fp8_rows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(IntTag<1>{});
    case 2: return f(IntTag<2>{});
    case 3: return f(IntTag<3>{});
    case 4: return f(IntTag<4>{});
    case 5: return f(IntTag<5>{});
    case 6: return f(IntTag<6>{});
    case 7: return f(IntTag<7>{});
    default: return f(IntTag<8>{});
  }
}

}  // namespace

void fp8_gemv(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k, std::optional<Tensor> bias) {
  const char* op = "fp8_gemv";
  const Fp8WeightArgs a = check_fp8_gemv_args(out, input, weight, scales, group_k, bias);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'input' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(weight);
  const int64_t m = input.size(0);
  const int threads = fp8_gemv_threads(a.k);
  const bool pdl = programmatic_launch_for(device, m);
  dispatch_fp8_rows(m, [&](auto m_tag) {
    constexpr int M = decltype(m_tag)::value;
    // Rows per block: 8 loads in flight per thread for 1-2 input rows; 4 from 3 rows, whose
    // converted weights stay in registers while the input rows stream past them.
    constexpr int R = M <= 2 ? 8 : 4;
    launch_kernel(fp8_gemv_kernel<M, R>, dim3(static_cast<unsigned>(ceil_div(a.n, R))), dim3(threads), 0, stream,
                  pdl, static_cast<__half*>(out.data_ptr()), m > 1 ? out.stride(0) : a.n,
                  static_cast<const __half*>(input.data_ptr()), m > 1 ? input.stride(0) : a.k,
                  static_cast<const unsigned char*>(weight.data_ptr()), static_cast<const float*>(scales.data_ptr()),
                  static_cast<int>(a.groups), static_cast<int>(a.group_k / kFp8VecWeights),
                  bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr, static_cast<int>(a.n),
                  static_cast<int>(a.k));
  });
  check_launch(op);
}

void fp8_dequantize(Tensor out, Tensor weight, Tensor scales, int64_t group_k) {
  const char* op = "fp8_dequantize";
  const Fp8WeightArgs a = check_fp8_dequantize_args(out, weight, scales, group_k);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(out.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'out' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t vectors = a.n * (a.k / kFp8VecWeights);
  constexpr int kThreads = 256;
  launch_kernel(fp8_dequantize_kernel, dim3(static_cast<unsigned>(ceil_div(vectors, kThreads))), dim3(kThreads), 0,
                current_stream(weight), false, static_cast<__half*>(out.data_ptr()),
                static_cast<const unsigned char*>(weight.data_ptr()), static_cast<const float*>(scales.data_ptr()),
                static_cast<int>(a.groups), static_cast<int>(a.group_k / kFp8VecWeights), vectors,
                static_cast<int>(a.k / kFp8VecWeights));
  check_launch(op);
}

}  // namespace vllm_volta
