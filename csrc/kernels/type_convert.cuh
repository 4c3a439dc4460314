// Device-side numeric types for the kernels: float <-> T conversion and 128-bit vectors.
// Device code only (no host-only includes), so NVRTC can compile it for compute_70.
//
// BF16 has no hardware support below SM80. Kernels are templates on T; for
// T = __nv_bfloat16 on an arch < 8.0 `arch_supports<T>::value` is false and the kernel
// body is discarded by `if constexpr` (never instantiated), leaving a __trap(). Host
// code refuses bf16 on such GPUs before launching (csrc/cuda_launch.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifdef __CUDACC_RTC__
using int64_t = long long;  // NVRTC has no <cstdint>
#else
#include <cstdint>
#endif

namespace vllm_volta {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define VLLM_VOLTA_ARCH_HAS_BF16 0
#else
#define VLLM_VOLTA_ARCH_HAS_BF16 1
#endif

template <typename T>
struct arch_supports {
  static constexpr bool value = true;
};
template <>
struct arch_supports<__nv_bfloat16> {
  static constexpr bool value = VLLM_VOLTA_ARCH_HAS_BF16;
};

// to_float / from_float per element type.
template <typename T>
struct Convert;

template <>
struct Convert<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};

template <>
struct Convert<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

#if VLLM_VOLTA_ARCH_HAS_BF16
template <>
struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};
#endif

// N elements of T loaded/stored as one access (N * sizeof(T) <= 16 bytes, aligned).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Round x to T and back: the value a T-typed intermediate would hold.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return Convert<T>::to_float(Convert<T>::from_float(x));
}

}  // namespace vllm_volta
