// Mixture-of-experts decode GEMVs (device code only): FP16 / FP32 on SM70+, BF16 on SM80+,
// FP32 accumulation. Each kernel reads only the chosen experts' weight rows, once per (token,
// expert) pair, with 16-byte loads: a block of blockDim.x threads (a multiple of 32) takes R
// weight rows and splits their K over its threads (thread i reads vectors i, i + threads, ...,
// two steps of R loads in flight), the partial sums meet through warp shuffles and one
// shared-memory pass. The grid depends only on the token count, so both kernels can be
// captured in a CUDA graph; expert ids are read on the device.
//  - moe_gemv_act_and_mul_kernel, grid (T k, ceil(I / (R/2))): pair p = (t, j) with expert
//    e = ids[p]; out[p][i] = act(gate) * up for R/2 features i, gate = x_t . w13[e][i] and
//    up = x_t . w13[e][I + i], each rounded to T first (the layer's gemm, then silu_and_mul or
//    gelu_tanh_and_mul: act is SiLU or tanh-approximated GELU).
//  - moe_gemv_down_sum_kernel, grid (T, ceil(H / R)): token t's rows h of every chosen expert,
//    out[t][h] = sum_j weights[t][j] * (in[t][j] . w2[e_j][h]): the routing weight and the
//    top-k sum in FP32, rounded to T once (no atomics, no second pass). Where a row needs fewer
//    than the block's threads, groups of threads take different experts at once.
#pragma once

#include "kernels/activation.cuh"
#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kMoeGemvThreads = 256;
constexpr int kMoeGemvSteps = 2;  // vectors of each row in flight per thread

// The elements of a 16-byte vector of T, as floats.
template <typename T>
__device__ __forceinline__ void vec16_to_float(const uint4& v, float (&f)[16 / sizeof(T)]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) f[i] = Convert<T>::to_float(e[i]);
}

// acc[r] += x . rows[r] over thread `tid`'s share (of `threads`) of nvec 16-byte vectors (x and
// rows aligned).
template <typename T, int R>
__device__ __forceinline__ void moe_rows_dot(const uint4* __restrict__ x, const uint4* const (&rows)[R], int nvec,
                                             float (&acc)[R], int tid, int threads) {
  constexpr int N = 16 / sizeof(T);
  for (int v0 = tid; v0 < nvec; v0 += threads * kMoeGemvSteps) {
    uint4 wv[kMoeGemvSteps][R];
    uint4 xv[kMoeGemvSteps];
#pragma unroll
    for (int s = 0; s < kMoeGemvSteps; ++s) {
      const int v = v0 + s * threads;
      const bool live = v < nvec;
      xv[s] = live ? x[v] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int r = 0; r < R; ++r) wv[s][r] = live ? rows[r][v] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int s = 0; s < kMoeGemvSteps; ++s) {
      float xf[N];
      vec16_to_float<T>(xv[s], xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[N];
        vec16_to_float<T>(wv[s][r], wf);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
  }
}

// Sums acc[r] over the block; returns, to every thread, sum r in `total` (shared scratch `partial`
// [warps][R]; the block must be synchronized before `partial` is reused).
template <int R>
__device__ __forceinline__ void moe_block_sums(float (&acc)[R], float (*partial)[R], float (&total)[R]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = s;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += partial[w][r];
    total[r] = s;
  }
}

template <typename T, int R, Activation A>
__global__ void __launch_bounds__(kMoeGemvThreads)
    moe_gemv_act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ input, const T* __restrict__ w13,
                                 const int* __restrict__ topk_ids, int top_k, int experts, int n, int k) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    static_assert(R % 2 == 0, "gate and up rows come in pairs");
    constexpr int C = R / 2;  // output features per block
    __shared__ float partial[kMoeGemvThreads / 32][R];
    const int pair = blockIdx.x, col0 = blockIdx.y * C;
    const int t = pair / top_k;
    // An out-of-range id (never written by topk) reads expert 0 rather than stray memory.
    int e = topk_ids[pair];
    e = e >= 0 && e < experts ? e : 0;
    const T* w = w13 + static_cast<int64_t>(e) * 2 * n * k;
    const uint4* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int col = min(col0 + r % C, n - 1);  // features past n repeat the last, not written
      rows[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r < C ? col : n + col) * k);
    }
    constexpr int N = 16 / sizeof(T);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    moe_rows_dot<T, R>(reinterpret_cast<const uint4*>(input + static_cast<int64_t>(t) * k), rows, k / N, acc,
                       threadIdx.x, blockDim.x);
    float total[R];
    moe_block_sums<R>(acc, partial, total);
    if (threadIdx.x < C && col0 + static_cast<int>(threadIdx.x) < n) {
      const int c = threadIdx.x;
      float gate = total[0], up = total[C];
#pragma unroll
      for (int r = 1; r < C; ++r) {  // the thread's own pair of sums (constant register indices)
        if (r == c) {
          gate = total[r];
          up = total[C + r];
        }
      }
      const float a = round_to<T>(activate<A>(round_to<T>(gate)));
      out[static_cast<int64_t>(pair) * n + col0 + c] = Convert<T>::from_float(a * round_to<T>(up));
    }
  }
}

template <typename T, int R>
__global__ void __launch_bounds__(kMoeGemvThreads)
    moe_gemv_down_sum_kernel(T* __restrict__ out, const T* __restrict__ input, const T* __restrict__ w2,
                             const int* __restrict__ topk_ids, const float* __restrict__ topk_weights, int top_k,
                             int experts, int n, int k, int group_threads) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    __shared__ float partial[kMoeGemvThreads / 32][R];
    const int t = blockIdx.x, row0 = blockIdx.y * R;
    constexpr int N = 16 / sizeof(T);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    // The block's threads form groups of group_threads; group g takes experts g, g + groups, ...
    // so that short rows (a small intermediate size) still keep every thread's loads in flight.
    const int groups = blockDim.x / group_threads, g = threadIdx.x / group_threads;
    const int tid = threadIdx.x % group_threads;
    for (int j = g; j < top_k; j += groups) {
      const int64_t pair = static_cast<int64_t>(t) * top_k + j;
      int e = topk_ids[pair];
      e = e >= 0 && e < experts ? e : 0;
      const float weight = topk_weights[pair];
      const T* w = w2 + static_cast<int64_t>(e) * n * k;
      const uint4* rows[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        rows[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(min(row0 + r, n - 1)) * k);
      float part[R];
#pragma unroll
      for (int r = 0; r < R; ++r) part[r] = 0.f;
      moe_rows_dot<T, R>(reinterpret_cast<const uint4*>(input + pair * k), rows, k / N, part, tid, group_threads);
      // The weight scales this thread's share: the block's sum is then the weighted sum.
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(weight, part[r], acc[r]);
    }
    float total[R];
    moe_block_sums<R>(acc, partial, total);
    if (threadIdx.x == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < n) out[static_cast<int64_t>(t) * n + row0 + r] = Convert<T>::from_float(total[r]);
    }
  }
}

}  // namespace vllm_volta
