// Gated RMSNorm of Gated DeltaNet layers (the norm before out_proj), one warp per (token, head)
// row of `dim` elements. Device code only. As transformers' RMSNormGated computes it:
//   normed = round_T(x * rsqrt(mean(x^2) + eps))        (FP32, rounded to T)
//   out    = round_T(round_T(weight * normed) * silu(gate))   (the gate in FP32)
#pragma once

#include "reduce.cuh"
#include "type_convert.cuh"

namespace vllm_volta {

constexpr int kGatedNormThreads = 128;  // 4 rows per block

template <typename T>
struct GatedNormParams {
  T* out;          // [N, heads * dim], rows out_stride apart
  const T* x;      // [N, heads * dim], rows x_stride apart
  const T* gate;   // [N, heads * dim], rows gate_stride apart
  const T* weight; // [dim]
  int64_t out_stride, x_stride, gate_stride;
  int64_t num_rows;  // N * heads
  int heads, dim;
  float eps;
};

template <typename T>
__global__ void gated_rms_norm_kernel(const GatedNormParams<T> p) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= p.num_rows) return;
    const int64_t token = row / p.heads;
    const int64_t col0 = (row % p.heads) * p.dim;
    const T* x = p.x + token * p.x_stride + col0;
    const T* gate = p.gate + token * p.gate_stride + col0;
    T* out = p.out + token * p.out_stride + col0;
    float ss = 0.f;
    for (int j = lane; j < p.dim; j += 32) {
      const float v = Convert<T>::to_float(x[j]);
      ss = fmaf(v, v, ss);
    }
    const float rs = rsqrtf(warp_sum(ss) / static_cast<float>(p.dim) + p.eps);
    for (int j = lane; j < p.dim; j += 32) {
      const float normed = round_to<T>(Convert<T>::to_float(x[j]) * rs);
      const float scaled = round_to<T>(Convert<T>::to_float(p.weight[j]) * normed);
      const float g = Convert<T>::to_float(gate[j]);
      out[j] = Convert<T>::from_float(scaled * (g / (1.f + expf(-g))));
    }
  }
}

}  // namespace vllm_volta
