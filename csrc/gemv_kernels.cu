// Host launcher of gemv (device code: kernels/gemv.cuh). No host sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "gemv_checks.h"
#include "kernels/gemv.cuh"
#include "ops.h"

namespace vllm_volta {

namespace {

// Calls f(IntTag<M>{}) for 1 <= M <= kGemvMaxRows (checked before).
template <typename F>
void dispatch_gemv_rows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(IntTag<1>{});
    case 2: return f(IntTag<2>{});
    case 3: return f(IntTag<3>{});
    default: return f(IntTag<4>{});
  }
}

// Weight rows per block when the caller leaves it to us: 4, so that each thread has 8
// loads in flight (2 steps x 4 rows) and the smallest decode GEMVs still have ~8 blocks
// per SM to balance over.
constexpr int64_t kGemvDefaultRowsPerBlock = 4;

}  // namespace

void gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block) {
  const char* op = "gemv";
  const GemvArgs a = check_gemv_args(out, input, weight, bias, rows_per_block);
  check_cuda(op, "input", input);
  auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  VLLM_VOLTA_CHECK(aligned16(input.data_ptr()) && aligned16(weight.data_ptr()), op,
                  ": 'input' and 'weight' must be 16-byte aligned");
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const int64_t rows = rows_per_block == 0 ? kGemvDefaultRowsPerBlock : rows_per_block;
  auto* o = static_cast<__half*>(out.data_ptr());
  const auto* x = static_cast<const __half*>(input.data_ptr());
  const auto* w = static_cast<const __half*>(weight.data_ptr());
  const __half* b = bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr;
  const int n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, rows)));
  dispatch_gemv_rows(a.m, [&](auto m_tag) {
    constexpr int M = decltype(m_tag)::value;
    switch (rows) {  // R rows x U vectors: 8 weight loads in flight per thread
      case 2: gemv_kernel<M, 2, 4><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, x, a.in_stride, w, b, n, k); break;
      case 4: gemv_kernel<M, 4, 2><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, x, a.in_stride, w, b, n, k); break;
      default: gemv_kernel<M, 8, 1><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, x, a.in_stride, w, b, n, k); break;
    }
  });
  check_launch(op);
}

}  // namespace vllm_volta
