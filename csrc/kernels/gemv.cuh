// Matrix-vector products for decode steps of 1 to 4 tokens (device code only), FP16 with
// FP32 accumulation, SM70 and newer: out[m][row] = sum_k x[m][k] * weight[row][k] (+ bias).
// The weight is streamed once, with 16-byte loads: a block of kGemvThreads threads owns R
// consecutive weight rows and splits K over all of its threads (thread t reads the 16-byte
// vectors t, t + kGemvThreads, ...), so each thread keeps U x R independent loads in flight;
// the input vectors are read once per step and reused for the R rows. Partial sums meet
// through warp shuffles and one shared-memory pass.
//
// A prologue may compute x from the op's input on the fly, so that the elementwise op before
// the product needs no kernel of its own (each block recomputes what it reads; the input is
// a few KB per token and stays in L2). Rounding follows the separate kernels
// (layernorm.cuh, activation.cuh): every intermediate they store in FP16 is rounded to FP16.
//  - kRmsNorm:    x = rms_norm(input) * norm_weight
//  - kAddRmsNorm: s = input + residual (written to residual_out by block 0), x = rms_norm(s) * norm_weight
//  - kSiluAndMul: input = [gate | up] (2K wide), x = silu(gate) * up
// The norms need each row's sum of squares first: a pre-pass over the input, reduced over
// the block.
#pragma once

#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;

enum class GemvPrologue { kNone, kRmsNorm, kAddRmsNorm, kSiluAndMul };

struct GemvInput {
  const __half* x;         // [M, K] rows x_stride apart ([M, 2K] for kSiluAndMul)
  int64_t x_stride;
  const __half* residual;  // kAddRmsNorm: [M, K], rows x_stride apart
  __half* residual_out;    // kAddRmsNorm: [M, K] contiguous
  const __half* norm_weight;  // norms: [K]
  float epsilon;
};

__device__ __forceinline__ void half8_to_float8(const uint4& v, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ float round_half(float x) { return __half2float(__float2half(x)); }

__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8], float acc) {
  float wf[8];
  half8_to_float8(w, wf);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], x[i], acc);
  return acc;
}

__device__ __forceinline__ const uint4* vec_row(const __half* base, int64_t stride, int m) {
  return reinterpret_cast<const uint4*>(base + m * stride);
}

// The norms' s = input (+ residual), as FP16 values in float; vector v of row m.
template <GemvPrologue P>
__device__ __forceinline__ void norm_source(const GemvInput& in, int m, int v, float (&s)[8]) {
  half8_to_float8(vec_row(in.x, in.x_stride, m)[v], s);
  if constexpr (P == GemvPrologue::kAddRmsNorm) {
    float r[8];
    half8_to_float8(vec_row(in.residual, in.x_stride, m)[v], r);
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = round_half(s[j] + r[j]);
  }
}

// Vector v (8 values) of the product's input row m.
template <GemvPrologue P>
__device__ __forceinline__ void load_x(const GemvInput& in, int m, int v, int nvec, float rstd, float (&x)[8]) {
  if constexpr (P == GemvPrologue::kNone) {
    half8_to_float8(vec_row(in.x, in.x_stride, m)[v], x);
  } else if constexpr (P == GemvPrologue::kSiluAndMul) {
    float g[8], u[8];
    half8_to_float8(vec_row(in.x, in.x_stride, m)[v], g);
    half8_to_float8(vec_row(in.x, in.x_stride, m)[nvec + v], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = round_half(round_half(g[j] / (1.f + expf(-g[j]))) * u[j]);
  } else {
    float w[8];
    norm_source<P>(in, m, v, x);
    half8_to_float8(reinterpret_cast<const uint4*>(in.norm_weight)[v], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = round_half(round_half(x[j] * rstd) * w[j]);
  }
}

// Norm prologues: 1 / rms of each input row (block-wide); block 0 stores residual_out.
template <GemvPrologue P, int M>
__device__ __forceinline__ void row_inv_rms(const GemvInput& in, int nvec, float (&inv_rms)[M]) {
  __shared__ float partial[kGemvWarps][M];
  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) ss[m] = 0.f;
  for (int v = threadIdx.x; v < nvec; v += kGemvThreads) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s[8];
      norm_source<P>(in, m, v, s);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss[m] += s[j] * s[j];
      if constexpr (P == GemvPrologue::kAddRmsNorm) {
        if (blockIdx.x == 0) {
          __half2 h[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(s[2 * j], s[2 * j + 1]);
          reinterpret_cast<uint4*>(in.residual_out + static_cast<int64_t>(m) * nvec * 8)[v] =
              *reinterpret_cast<const uint4*>(h);
        }
      }
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float s = warp_sum(ss[m]);
    if (lane == 0) partial[warp][m] = s;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kGemvWarps; ++i) total += partial[i][m];
    inv_rms[m] = rsqrtf(total / (nvec * 8) + in.epsilon);
  }
}

// M input rows, R weight rows per block, U vectors per thread per step in flight per row.
// k: the product's K (the input is 2K wide for kSiluAndMul).
template <int M, int R, int U, GemvPrologue P>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(__half* __restrict__ out, int64_t out_stride, GemvInput in, const __half* __restrict__ weight,
                const __half* __restrict__ bias, int n, int k) {
  const int nvec = k / 8;
  const int row0 = blockIdx.x * R;
  float inv_rms[M];
  if constexpr (P == GemvPrologue::kRmsNorm || P == GemvPrologue::kAddRmsNorm) row_inv_rms<P, M>(in, nvec, inv_rms);
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
        if (live) {
          load_x<P>(in, m, v, nvec, P == GemvPrologue::kNone || P == GemvPrologue::kSiluAndMul ? 0.f : inv_rms[m],
                    xv[u][m]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) xv[u][m][j] = 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = dot8(wv[u][r], xv[u][m], acc[m][r]);
  }

  __shared__ float partial[kGemvWarps][M * R];
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
      for (int i = 0; i < kGemvWarps; ++i) s += partial[i][threadIdx.x];
      out[m * out_stride + row] = __float2half(s);
    }
  }
}

}  // namespace vllm_volta
