// Host launchers of the W4A16 ops on the K-major 4-bit layout (device code: kernels/w4.cuh,
// kernels/w4_gemm.cuh). No host sync; CUDA-graph capturable (split-K partials come from the
// caching allocator). Launch parameters (rows_per_warp; block_m / block_n / splits) are the
// caller's: tuned per shape in vllm_volta/kernel_configs.py files (w4_kernels.py picks them).
#include "cuda_launch.h"
#include "kernels/awq.cuh"  // awq_reduce_kernel: sums split-K partials
#include "kernels/w4.cuh"
#include "kernels/w4_gemm.cuh"
#include "ops.h"
#include "w4_checks.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

namespace vllm_volta {

static_assert(kW4MaxGemvRows == kW4MaxGemvRowsHost, "host and kernel must agree on the gemv rows");

namespace {

void check_aligned(const char* op, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    VLLM_VOLTA_CHECK(is_aligned16(p), op, ": the tensors' data must be 16-byte aligned");
}

template <int M>
void launch_gemv(int rows_per_warp, cudaStream_t stream, bool pdl, __half* out,
                 const __half* x, const uint4* qweight, const __half2* sz, const W4Args& a) {
  auto go = [&](auto r_tag) {
    constexpr int R = decltype(r_tag)::value;
    const unsigned blocks = static_cast<unsigned>(ceil_div(ceil_div(a.n, R), kW4GemvWarps));
    launch_kernel(w4_gemv_kernel<M, R>, dim3(blocks), dim3(32 * kW4GemvWarps), 0, stream, pdl, out, x, qweight, sz,
                  static_cast<int>(a.n), static_cast<int>(a.k), static_cast<int>(a.groups), a.group_shift);
  };
  if constexpr (M <= 4) {
    if (rows_per_warp == 4) return go(IntTag<4>{});
  }
  if (rows_per_warp == 2) return go(IntTag<2>{});
  go(IntTag<1>{});
}

}  // namespace

void w4_dequantize(Tensor out, Tensor qweight, Tensor sz) {
  const char* op = "w4_dequantize";
  const W4Args a = check_w4_dequantize_args(out, qweight, sz);
  check_cuda(op, "qweight", qweight);
  check_aligned(op, {out.data_ptr(), qweight.data_ptr()});
  const int device = qweight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t words = a.n * (a.k / 8);
  constexpr int kThreads = 256;
  launch_kernel(w4_dequantize_kernel, dim3(static_cast<unsigned>(ceil_div(words, kThreads))), dim3(kThreads), 0,
                current_stream(qweight), false, static_cast<__half*>(out.data_ptr()),
                static_cast<const unsigned*>(qweight.data_ptr()), static_cast<const __half2*>(sz.data_ptr()), a.n,
                a.k, static_cast<int>(a.groups), a.group_shift);
  check_launch(op);
}

void w4_gemv(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t rows_per_warp) {
  const char* op = "w4_gemv";
  const W4Args a = check_w4_gemv_args(out, input, qweight, sz, rows_per_warp);
  check_cuda(op, "qweight", qweight);
  check_aligned(op, {input.data_ptr(), qweight.data_ptr(), sz.data_ptr()});
  const int device = qweight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t m = input.size(0);
  const bool pdl = programmatic_launch_for(device, m);
  auto* o = static_cast<__half*>(out.data_ptr());
  const auto* x = static_cast<const __half*>(input.data_ptr());
  const auto* w = static_cast<const uint4*>(qweight.data_ptr());
  const auto* s = static_cast<const __half2*>(sz.data_ptr());
  const cudaStream_t stream = current_stream(qweight);
  const int r = static_cast<int>(rows_per_warp);
  switch (m) {
    case 1: launch_gemv<1>(r, stream, pdl, o, x, w, s, a); break;
    case 2: launch_gemv<2>(r, stream, pdl, o, x, w, s, a); break;
    case 3: launch_gemv<3>(r, stream, pdl, o, x, w, s, a); break;
    case 4: launch_gemv<4>(r, stream, pdl, o, x, w, s, a); break;
    case 5: launch_gemv<5>(r, stream, pdl, o, x, w, s, a); break;
    case 6: launch_gemv<6>(r, stream, pdl, o, x, w, s, a); break;
    case 7: launch_gemv<7>(r, stream, pdl, o, x, w, s, a); break;
    default: launch_gemv<8>(r, stream, pdl, o, x, w, s, a); break;
  }
  check_launch(op);
}

void w4_gemm(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t block_m, int64_t block_n,
             int64_t splits) {
  const char* op = "w4_gemm";
  const W4Args a = check_w4_gemm_args(out, input, qweight, sz, block_m, block_n, splits);
  check_cuda(op, "qweight", qweight);
  check_aligned(op, {input.data_ptr(), qweight.data_ptr(), sz.data_ptr()});
  const int device = qweight.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(qweight);
  const int64_t m = input.size(0);
  const int64_t steps = ceil_div(a.k, kW4GemmBK);
  const int64_t steps_per_split = ceil_div(steps, splits);
  const int64_t used = ceil_div(steps, steps_per_split);  // no empty split
  const bool pdl = programmatic_launch_for(device, m);
  Tensor partial = out;
  float* partial_ptr = nullptr;
  if (used > 1) {
    const std::vector<int64_t> size{used * m * a.n};
    partial = torch::stable::new_empty(input, size, ScalarType::Float);
    partial_ptr = static_cast<float*>(partial.data_ptr());
  }
  auto go = [&](auto bm_tag, auto bn_tag) {
    constexpr int BM = decltype(bm_tag)::value, BN = decltype(bn_tag)::value;
    const dim3 grid(static_cast<unsigned>(ceil_div(a.n, BN)), static_cast<unsigned>(ceil_div(m, BM)),
                    static_cast<unsigned>(used));
    launch_kernel(w4_gemm_kernel<BM, BN>, grid, dim3(kW4GemmThreads), 0, stream, pdl,
                  static_cast<__half*>(out.data_ptr()), partial_ptr, static_cast<const __half*>(input.data_ptr()),
                  static_cast<const uint4*>(qweight.data_ptr()), static_cast<const __half2*>(sz.data_ptr()),
                  static_cast<int>(m), static_cast<int>(a.n), static_cast<int>(a.k), static_cast<int>(a.groups),
                  a.group_shift, static_cast<int>(steps_per_split));
  };
  auto with_bn = [&](auto bm_tag) {
    constexpr int BM = decltype(bm_tag)::value;
    if (block_n == 128) return go(bm_tag, IntTag<128>{});
    if constexpr (BM >= 32) {
      if (block_n == 32) return go(bm_tag, IntTag<32>{});
    }
    go(bm_tag, IntTag<64>{});
  };
  if (block_m == 16) {
    with_bn(IntTag<16>{});
  } else if (block_m == 32) {
    with_bn(IntTag<32>{});
  } else {
    with_bn(IntTag<64>{});
  }
  if (used > 1) {
    const int64_t outputs = m * a.n;
    launch_kernel(awq_reduce_kernel, dim3(static_cast<unsigned>(ceil_div(outputs, 256))), dim3(256), 0, stream, pdl,
                  static_cast<__half*>(out.data_ptr()), static_cast<const float*>(partial_ptr), outputs,
                  static_cast<int>(used));
  }
  check_launch(op);
}

}  // namespace vllm_volta
