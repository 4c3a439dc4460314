// Gated activations (device code only): out[t, i] = act(x[t, i]) * x[t, d + i].
// act is computed in fp32 and rounded to T before the multiply (vLLM's order, and what
// `F.silu(a) * b` does in PyTorch). Grid: x = rows, y = chunks of the row.
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

enum class Activation { kSilu, kGelu, kGeluTanh };

template <Activation A>
__device__ __forceinline__ float activate(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.f + expf(-x));
  } else if constexpr (A == Activation::kGelu) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));  // x / sqrt(2)
  } else {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);  // sqrt(2/pi)
    return 0.5f * x * (1.f + tanhf(inner));
  }
}

// `in_stride` (elements) separates input rows; `out` is contiguous [rows, d].
template <typename T, int VEC, Activation A>
__global__ void act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t in_stride, int d) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    using V = Vec<T, VEC>;
    const int64_t row = blockIdx.x;
    const V* gate = reinterpret_cast<const V*>(in + row * in_stride);
    const V* up = reinterpret_cast<const V*>(in + row * in_stride + d);
    V* out_row = reinterpret_cast<V*>(out + row * d);
    const int num_vecs = d / VEC;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < num_vecs; i += gridDim.y * blockDim.x) {
      const V g = gate[i];
      const V u = up[i];
      V y;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float a = round_to<T>(activate<A>(Convert<T>::to_float(g.v[j])));
        y.v[j] = Convert<T>::from_float(a * Convert<T>::to_float(u.v[j]));
      }
      out_row[i] = y;
    }
  }
}

}  // namespace vllm_volta
