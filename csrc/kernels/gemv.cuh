// Matrix-vector products for decode steps of 1 to 4 tokens (device code only), FP16 with
// FP32 accumulation, SM70 and newer: out[m][row] = sum_k input[m][k] * weight[row][k].
// The weight is streamed once, with 16-byte loads: a block of kGemvThreads threads owns R
// consecutive weight rows and splits K over all of its threads (thread t reads the 16-byte
// vectors t, t + kGemvThreads, ...), so each thread keeps U x R independent loads in flight;
// the input vectors are read once per step and reused for the R rows. Partial sums meet
// through warp shuffles and one shared-memory pass.
#pragma once

#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kGemvThreads = 256;

__device__ __forceinline__ void half8_to_float8(const uint4& v, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8], float acc) {
  float wf[8];
  half8_to_float8(w, wf);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], x[i], acc);
  return acc;
}

// M input rows, R weight rows per block, U vectors per thread per step in flight per row.
template <int M, int R, int U>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(__half* __restrict__ out, int64_t out_stride, const __half* __restrict__ input, int64_t in_stride,
                const __half* __restrict__ weight, const __half* __restrict__ bias, int n, int k) {
  const int nvec = k / 8;
  const int row0 = blockIdx.x * R;
  const uint4* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // rows past n read row n - 1 and are not written
    w[r] = reinterpret_cast<const uint4*>(weight + static_cast<int64_t>(min(row0 + r, n - 1)) * k);
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

  for (int v0 = threadIdx.x; v0 < nvec; v0 += kGemvThreads * U) {
    uint4 wv[U][R];
    float xv[U][M][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * kGemvThreads;
      const bool live = v < nvec;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = live ? w[r][v] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 x = live ? reinterpret_cast<const uint4*>(input + m * in_stride)[v] : make_uint4(0u, 0u, 0u, 0u);
        half8_to_float8(x, xv[u][m]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = dot8(wv[u][r], xv[u][m], acc[m][r]);
  }

  constexpr int kWarps = kGemvThreads / 32;
  __shared__ float partial[kWarps][M * R];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[m][r]);
      if (lane == 0) partial[warp][m * R + r] = s;
    }
  __syncthreads();
  if (threadIdx.x < M * R) {
    const int m = threadIdx.x / R, row = row0 + threadIdx.x % R;
    if (row < n) {
      float s = bias != nullptr ? __half2float(bias[row]) : 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) s += partial[i][threadIdx.x];
      out[m * out_stride + row] = __float2half(s);
    }
  }
}

}  // namespace vllm_volta
