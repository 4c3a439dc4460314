// Host launchers of awq_dequantize and awq_gemv (device code: kernels/awq.cuh). No host sync;
// CUDA-graph capturable (awq_gemv's FP32 split scratch comes from the caching allocator).
#include "awq_checks.h"
#include "cuda_launch.h"
#include "kernels/awq.cuh"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <vector>

namespace vllm_volta {

static_assert(kAwqGemvMaxRows == kAwqMaxGemvRows, "host and kernel must agree on the gemv rows");

namespace {

void check_aligned(const char* op, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    VLLM_VOLTA_CHECK(is_aligned16(p), op, ": the tensors' data must be 16-byte aligned");
}

}  // namespace

void awq_dequantize(Tensor out, Tensor qweight, Tensor qzeros, Tensor scales) {
  const char* op = "awq_dequantize";
  const AwqArgs a = check_awq_dequantize_args(out, qweight, qzeros, scales);
  check_cuda(op, "qweight", qweight);
  check_aligned(op, {out.data_ptr(), scales.data_ptr()});
  const int device = qweight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t packed = a.k * (a.n / 8);
  constexpr int kThreads = 256;
  launch_kernel(awq_dequantize_kernel, dim3(static_cast<unsigned>(ceil_div(packed, kThreads))), dim3(kThreads), 0,
                current_stream(qweight), false, static_cast<__half*>(out.data_ptr()),
                static_cast<const int*>(qweight.data_ptr()), static_cast<const int*>(qzeros.data_ptr()),
                static_cast<const __half*>(scales.data_ptr()), a.k, a.n / 8, static_cast<int>(a.group_size));
  check_launch(op);
}

void awq_gemv(Tensor out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales) {
  const char* op = "awq_gemv";
  const AwqArgs a = check_awq_gemv_args(out, input, qweight, qzeros, scales);
  check_cuda(op, "qweight", qweight);
  check_aligned(op, {scales.data_ptr()});
  const int device = qweight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(qweight);
  const int64_t m = input.size(0);
  const int64_t col_blocks = ceil_div(a.n / 8, 32);
  // Split K so that the grid fills about two blocks per SM; each split at least 64 rows of K.
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t max_splits = std::max<int64_t>(1, a.k / 64);
  const int64_t splits = std::min(max_splits, std::max<int64_t>(1, ceil_div(2 * sms, col_blocks)));
  const int64_t split_len = ceil_div(a.k, splits);
  const int64_t used = ceil_div(a.k, split_len);
  const std::vector<int64_t> size{used * m * a.n};
  Tensor partial = torch::stable::new_empty(input, size, ScalarType::Float);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(used));
  const bool pdl = programmatic_launch_for(device, m);
  auto launch = [&](auto m_tag) {
    constexpr int M = decltype(m_tag)::value;
    launch_kernel(awq_gemv_kernel<M>, grid, dim3(32 * kAwqGemvWarps), 0, stream, pdl,
                  static_cast<float*>(partial.data_ptr()), static_cast<const __half*>(input.data_ptr()),
                  static_cast<const int*>(qweight.data_ptr()), static_cast<const int*>(qzeros.data_ptr()),
                  static_cast<const __half*>(scales.data_ptr()), a.k, a.n / 8, static_cast<int>(a.group_size),
                  split_len);
  };
  switch (m) {
    case 1: launch(IntTag<1>{}); break;
    case 2: launch(IntTag<2>{}); break;
    case 3: launch(IntTag<3>{}); break;
    default: launch(IntTag<4>{}); break;
  }
  const int64_t outputs = m * a.n;
  launch_kernel(awq_reduce_kernel, dim3(static_cast<unsigned>(ceil_div(outputs, 256))), dim3(256), 0, stream, pdl,
                static_cast<__half*>(out.data_ptr()), static_cast<const float*>(partial.data_ptr()), outputs,
                static_cast<int>(used));
  check_launch(op);
}

}  // namespace vllm_volta
