// FP8 (e4m3fn) weights kept in FP8, converted in registers (device code only): SM70 and newer,
// FP16 activations and outputs (BF16 on SM80+: its instances compile to a trap below), FP32
// accumulation, no FP8 instructions.
// Weight [N, K] row-major, one byte a value (as checkpoints store it); scales float32 [N, G]: one
// per output row and group of group_k inputs (G = ceil(K / group_k)), or G = 1 (per channel /
// per tensor expanded to rows). W[n][k] = fp8(weight[n][k]) * scales[n][k / group_k].
//  fp8_gemv_kernel<T, M, R>: out[m][n] = sum_k x[m][k] W[n][k] (+ bias[n]) for M <= kFp8GemvMaxRows
//    decode rows. A block owns R consecutive weight rows and splits K over its threads in 16-byte
//    vectors (16 weights): thread t reads vectors t, t + T, ... of each row, so it keeps R loads
//    in flight, plus the next step's R while it computes. Each vector's 16 products are summed in
//    FP32, then added times their group's scale (group_k is a multiple of 16, so a vector never
//    straddles two groups). The weights are converted in their raw form (value / 256, exact;
//    kernels/fp8_convert.cuh) with the 256 folded into the scale. Partial sums meet through warp
//    shuffles and one shared-memory pass.
//  fp8_dequantize_kernel<T>: out [N, K] = W in T, one 16-byte vector (16 weights) per thread, each
//    value rounded once (fp8 -> half exactly, times the float32 scale, rounded to T).
#pragma once

#include "kernels/fp8_convert.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

#ifdef __CUDACC_RTC__
using int64_t = long long;
#endif

namespace vllm_volta {

constexpr int kFp8GemvMaxRows = 8;
constexpr int kFp8GemvThreads = 256;
constexpr int kFp8VecWeights = 16;  // weights per 16-byte vector

// x[16 v .. 16 v + 16) of one row (float16 / bfloat16) as floats.
template <typename T>
__device__ __forceinline__ void load_x16(const T* row, int v, float (&f)[16]) {
  const uint4* p = reinterpret_cast<const uint4*>(row) + 2 * v;
  const uint4 parts[2] = {p[0], p[1]};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const T* e = reinterpret_cast<const T*>(&parts[j]);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[8 * j + i] = Convert<T>::to_float(e[i]);
  }
}

__device__ __forceinline__ float dot16(const float (&a)[16], const float (&b)[16]) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

// M input rows (row stride x_stride), R weight rows per block; groups = G, group_vecs = group_k / 16
// (unused when G = 1). Rows past n read row n - 1 and are not written.
template <typename T, int M, int R>
__device__ __forceinline__ void fp8_gemv_body(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                                              int64_t x_stride, const unsigned char* __restrict__ weight,
                                              const float* __restrict__ scales, int groups, int group_vecs,
                                              const T* __restrict__ bias, int n, int k) {
  const int nvec = k / kFp8VecWeights;
  const int row0 = blockIdx.x * R;
  const uint4* w[R];
  const float* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(row0 + r, n - 1);
    w[r] = reinterpret_cast<const uint4*>(weight + row * k);
    srow[r] = scales + row * groups;
  }
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

  const int threads = blockDim.x;
  uint4 next[R];
  auto load = [&](int v) {
#pragma unroll
    for (int r = 0; r < R; ++r) next[r] = v < nvec ? __ldg(w[r] + v) : make_uint4(0u, 0u, 0u, 0u);
  };
  // The weights are constant: their first loads may go out before the kernel writing x ends.
  pdl_launch_dependents();
  load(threadIdx.x);
  pdl_wait();
  for (int v = threadIdx.x; v < nvec; v += threads) {
    uint4 cur[R];
#pragma unroll
    for (int r = 0; r < R; ++r) cur[r] = next[r];
    if (v + threads < nvec) load(v + threads);  // in flight while this step computes
    const int g = groups == 1 ? 0 : v / group_vecs;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = __ldg(srow[r] + g) * kFp8RawScale;
    if constexpr (M <= 2) {
      // Few input rows: convert them once, then each weight row in turn (few live registers).
      float xf[M][16];
#pragma unroll
      for (int m = 0; m < M; ++m) load_x16(x + m * x_stride, v, xf[m]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[16];
        fp8x16_to_float_raw(cur[r], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m][r] = fmaf(dot16(wf, xf[m]), s[r], acc[m][r]);
      }
    } else {
      // More input rows: convert the weight rows once, then stream the input rows past them.
      float wf[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) fp8x16_to_float_raw(cur[r], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[16];
        load_x16(x + m * x_stride, v, xf);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = fmaf(dot16(wf[r], xf), s[r], acc[m][r]);
      }
    }
  }

  __shared__ float partial[kFp8GemvThreads / 32][M * R];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = threads / 32;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float sum = warp_sum(acc[m][r]);
      if (lane == 0) partial[warp][m * R + r] = sum;
    }
  __syncthreads();
  if (threadIdx.x < M * R) {
    const int m = threadIdx.x / R, r = threadIdx.x % R, row = row0 + r;
    if (row < n) {
      float y = bias != nullptr ? Convert<T>::to_float(bias[row]) : 0.f;
      for (int i = 0; i < warps; ++i) y += partial[i][threadIdx.x];
      out[m * out_stride + row] = Convert<T>::from_float(y);
    }
  }
}

template <typename T, int M, int R>
__global__ void __launch_bounds__(kFp8GemvThreads)
    fp8_gemv_kernel(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x, int64_t x_stride,
                    const unsigned char* __restrict__ weight, const float* __restrict__ scales, int groups,
                    int group_vecs, const T* __restrict__ bias, int n, int k) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    fp8_gemv_body<T, M, R>(out, out_stride, x, x_stride, weight, scales, groups, group_vecs, bias, n, k);
  }
}

// out [N, K] = the dequantized weight in T; vectors: N * K / 16.
template <typename T>
__device__ __forceinline__ void fp8_dequantize_body(T* __restrict__ out, const unsigned char* __restrict__ weight,
                                                    const float* __restrict__ scales, int groups, int group_vecs,
                                                    int64_t vectors, int nvec) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= vectors) return;
  const int64_t row = idx / nvec;
  const int v = static_cast<int>(idx % nvec);
  const float s = scales[row * groups + (groups == 1 ? 0 : v / group_vecs)];
  const uint4 q = reinterpret_cast<const uint4*>(weight)[idx];
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  __align__(16) T h[16];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 lo, hi;
    fp8x4_to_half2x2(words[i], lo, hi);
    const float2 a = __half22float2(lo), b = __half22float2(hi);
    h[4 * i] = Convert<T>::from_float(a.x * s);
    h[4 * i + 1] = Convert<T>::from_float(a.y * s);
    h[4 * i + 2] = Convert<T>::from_float(b.x * s);
    h[4 * i + 3] = Convert<T>::from_float(b.y * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out) + 2 * idx;
  dst[0] = *reinterpret_cast<const uint4*>(&h[0]);
  dst[1] = *reinterpret_cast<const uint4*>(&h[8]);
}

template <typename T>
__global__ void fp8_dequantize_kernel(T* __restrict__ out, const unsigned char* __restrict__ weight,
                                      const float* __restrict__ scales, int groups, int group_vecs, int64_t vectors,
                                      int nvec) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    fp8_dequantize_body<T>(out, weight, scales, groups, group_vecs, vectors, nvec);
  }
}

}  // namespace vllm_volta
