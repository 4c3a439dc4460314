// RMSNorm kernels (device code only): blockDim.x threads per row, blockDim.y rows per block,
// VEC elements per access.
//   rms_norm:           out = round_T(x * inv_rms) * w          (x = input row)
//   fused_add_rms_norm: z = round_T(x + r); r <- z; x <- round_T(z * inv_rms) * w
// inv_rms = rsqrt(mean(x^2) + eps) accumulated in fp32. Rounding to T before the weight
// multiply matches vLLM and Hugging Face RMSNorm.
// Each thread keeps up to kRmsNormCache vectors of its row (and of the weight) in registers,
// all loaded before the reduction (many loads in flight), so the row is read once; rows longer
// than blockDim.x * kRmsNormCache * VEC re-read the rest.
#pragma once

#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kRmsNormCache = 2;  // the launcher sizes blocks so rows up to 2048 vectors fit

template <typename T, int VEC>
__device__ __forceinline__ float sum_squares(const Vec<T, VEC>& x) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float f = Convert<T>::to_float(x.v[j]);
    s += f * f;
  }
  return s;
}

// ADD: z = x + r, stored to r (returned for the sum of squares).
template <typename T, int VEC, bool ADD>
__device__ __forceinline__ Vec<T, VEC> load_source(const Vec<T, VEC>* in, Vec<T, VEC>* res, int i) {
  Vec<T, VEC> x = in[i];
  if constexpr (ADD) {
    const Vec<T, VEC> r = res[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      x.v[j] = Convert<T>::from_float(Convert<T>::to_float(x.v[j]) + Convert<T>::to_float(r.v[j]));
    res[i] = x;
  }
  return x;
}

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> normalize(const Vec<T, VEC>& x, const Vec<T, VEC>& w, float inv_rms) {
  Vec<T, VEC> y;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float normed = round_to<T>(Convert<T>::to_float(x.v[j]) * inv_rms);
    y.v[j] = Convert<T>::from_float(normed * Convert<T>::to_float(w.v[j]));
  }
  return y;
}

// Strides are in elements. For fused_add_rms_norm `out` == `in` (in place) and
// `residual` is contiguous; for rms_norm `residual` is null.
template <typename T, int VEC, bool ADD>
__global__ void rms_norm_kernel(T* out, int64_t out_stride, const T* in, int64_t in_stride,
                                T* residual, const T* __restrict__ weight, float epsilon, int hidden,
                                int64_t rows) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    using V = Vec<T, VEC>;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    const bool active = row < rows;  // the last block may have idle rows (still in the reduction)
    const V* in_row = reinterpret_cast<const V*>(in + row * in_stride);
    V* res_row = ADD ? reinterpret_cast<V*>(residual + row * hidden) : nullptr;
    const int num_vecs = active ? hidden / VEC : 0;

    // The cached vectors' weights are loaded with them, so their latency hides behind the
    // reduction instead of following it.
    const V* w = reinterpret_cast<const V*>(weight);
    V cache[kRmsNormCache], w_cache[kRmsNormCache];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kRmsNormCache; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        cache[k] = load_source<T, VEC, ADD>(in_row, res_row, i);
        w_cache[k] = w[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kRmsNormCache; ++k)
      if (threadIdx.x + k * blockDim.x < num_vecs) ss += sum_squares<T, VEC>(cache[k]);
    for (int i = threadIdx.x + kRmsNormCache * blockDim.x; i < num_vecs; i += blockDim.x)
      ss += sum_squares<T, VEC>(load_source<T, VEC, ADD>(in_row, res_row, i));

    const float inv_rms = rsqrtf(row_sum(ss) / hidden + epsilon);
    if (!active) return;

    V* out_row = reinterpret_cast<V*>(out + row * out_stride);
#pragma unroll
    for (int k = 0; k < kRmsNormCache; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) out_row[i] = normalize<T, VEC>(cache[k], w_cache[k], inv_rms);
    }
    // Beyond the cache: re-read the (already summed) source, z from residual when ADD.
    const V* again = ADD ? res_row : in_row;
    for (int i = threadIdx.x + kRmsNormCache * blockDim.x; i < num_vecs; i += blockDim.x)
      out_row[i] = normalize<T, VEC>(again[i], w[i], inv_rms);
  }
}

}  // namespace vllm_volta
