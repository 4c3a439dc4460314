// Host launchers of fp8_gemv, fp8_gemm and fp8_dequantize (device code: kernels/fp8_gemv.cuh,
// kernels/fp8_gemm.cuh): FP8 weights kept in FP8 and converted with integer operations, so they
// run on SM70 and newer. No host sync; CUDA-graph capturable (fp8_gemm's FP32 split scratch comes
// from the caching allocator).
#include "cuda_launch.h"
#include "fp8_checks.h"
#include "kernels/fp8_gemm.cuh"
#include "kernels/fp8_gemv.cuh"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace vllm_volta {

static_assert(kFp8GemvMaxRows == kFp8MaxGemvRows, "host and kernel must agree on the gemv rows");
static_assert(kFp8GemvMaxRows == 8, "dispatch_rows_up_to_8 covers the gemv rows");

namespace {

// Threads per block: the fewest whole warps that give every thread a vector of the row (K = 4096:
// 256 vectors, 256 threads), at most kFp8GemvThreads.
int fp8_gemv_threads(int64_t k) {
  const int64_t vectors = k / kFp8VecWeights;
  return vectors >= kFp8GemvThreads ? kFp8GemvThreads : round_up(static_cast<int>(vectors), 32);
}

// Calls f(TypeTag<T>{}) for t's dtype, float16 or bfloat16 (checked before); bfloat16 only where
// dispatch_float_type allows it (an SM80+ build and GPU).
template <typename F>
void dispatch_fp8_activation(const char* op, const Tensor& t, F&& f) {
  dispatch_float_type(op, t, [&](auto tag) {
    if constexpr (!std::is_same_v<typename decltype(tag)::type, float>) f(tag);
  });
}

}  // namespace

void fp8_gemv(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k, std::optional<Tensor> bias,
              int64_t rows_per_block) {
  const char* op = "fp8_gemv";
  const Fp8WeightArgs a = check_fp8_gemv_args(out, input, weight, scales, group_k, bias, rows_per_block);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'input' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(weight);
  const int64_t m = input.size(0);
  const int threads = fp8_gemv_threads(a.k);
  const bool pdl = programmatic_launch_for(device, m);
  dispatch_fp8_activation(op, input, [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    dispatch_rows_up_to_8(m, [&](auto m_tag) {
      constexpr int M = decltype(m_tag)::value;
      auto launch = [&](auto r_tag) {
        constexpr int R = decltype(r_tag)::value;
        launch_kernel(fp8_gemv_kernel<T, M, R>, dim3(static_cast<unsigned>(ceil_div(a.n, R))), dim3(threads), 0,
                      stream, pdl, static_cast<T*>(out.data_ptr()), m > 1 ? out.stride(0) : a.n,
                      static_cast<const T*>(input.data_ptr()), m > 1 ? input.stride(0) : a.k,
                      static_cast<const unsigned char*>(weight.data_ptr()),
                      static_cast<const float*>(scales.data_ptr()), static_cast<int>(a.groups),
                      static_cast<int>(a.group_k / kFp8VecWeights),
                      bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr, static_cast<int>(a.n),
                      static_cast<int>(a.k));
      };
      // Automatic: 8 rows (8 loads in flight per thread) for 1-2 input rows; 4 from 3 rows, whose
      // converted weights stay in registers while the input rows stream past them (8 would spill).
      const int64_t r = rows_per_block != 0 ? rows_per_block : M <= 2 ? 8 : 4;
      if (r == 2) return launch(IntTag<2>{});
      if constexpr (M <= 2) {
        if (r == 8) return launch(IntTag<8>{});
      }
      launch(IntTag<4>{});
    });
  });
  check_launch(op);
}

// K splits of fp8_gemm when the caller leaves it to us: enough (n, m) tiles x splits for two
// blocks per SM, each split at least 4 steps of kFp8GemmBK inputs.
int64_t auto_split_k(int64_t tiles, int64_t steps, int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    sms = 80;
  }
  return std::clamp<int64_t>(ceil_div(2 * sms, tiles), 1, std::max<int64_t>(1, steps / 4));
}

void fp8_gemm(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k, std::optional<Tensor> bias,
              int64_t split_k) {
  const char* op = "fp8_gemm";
  const Fp8WeightArgs a = check_fp8_gemm_args(out, input, weight, scales, group_k, bias, split_k);
  check_cuda(op, "weight", weight);
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(weight.data_ptr()), op,
                  ": 'input' and 'weight' must be 16-byte aligned");
  const int device = weight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(weight);
  const int64_t m = input.size(0);
  // Input rows per block: the fewest 16-row fragments that hold them, at most 4 (64 rows).
  const int fm = m <= 16 ? 1 : m <= 32 ? 2 : 4;
  const int64_t n_tiles = ceil_div(a.n, kFp8GemmBN), m_tiles = ceil_div(m, 16 * fm);
  const int64_t steps = ceil_div(a.k, kFp8GemmBK);
  const int64_t wanted = split_k > 0 ? split_k : auto_split_k(n_tiles * m_tiles, steps, device);
  const int64_t k_split = ceil_div(steps, wanted) * kFp8GemmBK;
  const int64_t splits = ceil_div(a.k, k_split);  // none empty
  VLLM_VOLTA_CHECK(m_tiles <= 65535, op, ": 'input' has too many rows (", m, ") for one launch");
  std::optional<Tensor> partial;
  if (splits > 1) partial = torch::stable::new_empty(input, std::vector<int64_t>{splits * m * a.n}, ScalarType::Float);
  const int64_t out_stride = m > 1 ? out.stride(0) : a.n;
  const bool pdl = programmatic_launch_for(device, m);
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles), static_cast<unsigned>(splits));
  dispatch_fp8_activation(op, input, [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    auto* o = static_cast<T*>(out.data_ptr());
    const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
    auto launch = [&](auto kernel) {
      launch_kernel(kernel, grid, dim3(kFp8GemmThreads), 0, stream, pdl, o, out_stride,
                    partial.has_value() ? static_cast<float*>(partial->data_ptr()) : nullptr,
                    static_cast<const T*>(input.data_ptr()), m > 1 ? input.stride(0) : a.k,
                    static_cast<const unsigned char*>(weight.data_ptr()),
                    static_cast<const float*>(scales.data_ptr()), static_cast<int>(a.groups),
                    static_cast<int>(a.group_k / kFp8VecWeights), b, static_cast<int>(m), static_cast<int>(a.n),
                    static_cast<int>(a.k), static_cast<int>(k_split));
    };
    switch (fm) {
      case 1: launch(fp8_gemm_kernel<T, 1>); break;
      case 2: launch(fp8_gemm_kernel<T, 2>); break;
      default: launch(fp8_gemm_kernel<T, 4>); break;
    }
    if (partial.has_value()) {
      const int64_t outputs = m * a.n;
      launch_kernel(fp8_gemm_reduce_kernel<T>, dim3(static_cast<unsigned>(ceil_div(outputs, 256))), dim3(256), 0,
                    stream, pdl, o, out_stride, static_cast<const float*>(partial->data_ptr()), b,
                    static_cast<int>(m), static_cast<int>(a.n), static_cast<int>(splits));
    }
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
  dispatch_fp8_activation(op, out, [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    launch_kernel(fp8_dequantize_kernel<T>, dim3(static_cast<unsigned>(ceil_div(vectors, kThreads))),
                  dim3(kThreads), 0, current_stream(weight), false, static_cast<T*>(out.data_ptr()),
                  static_cast<const unsigned char*>(weight.data_ptr()), static_cast<const float*>(scales.data_ptr()),
                  static_cast<int>(a.groups), static_cast<int>(a.group_k / kFp8VecWeights), vectors,
                  static_cast<int>(a.k / kFp8VecWeights));
  });
  check_launch(op);
}

}  // namespace vllm_volta
