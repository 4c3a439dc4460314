// 4-bit mixture-of-experts kernels (device code only): FP16 activations, SM70 and newer (half2
// math only, no BF16, no SM80-only intrinsics), FP32 accumulation across 32-value chunks.
// Layout (vllm_volta/model_executor/layers/quantization/moe_w4_layout.py), per expert e:
// qweight int32 [E, N, K / 8], row n's K values contiguous, int32 j holding k = 8j + 2i + h in
// bits 4i + 16h; sz half2 [E, N, G] = (scale, zero point) of row n's group; W[n][k] = (q - z) * s.
// K % 32 == 0 and a group is a whole number of 32-value chunks (one 16-byte load each).
// A "team" of TL lanes (8, 16 or 32, inside one warp) owns a weight row and strides along its
// chunks, several chunks in flight per row; the team's sums meet through shuffles. Only the chosen
// experts' rows are read; grids follow the token count alone (CUDA-graph capturable).
//  - moe_w4_gemv_act_and_mul_kernel<TL, A>, grid (T k, ceil(I / features per block)): a team takes
//    feature i of pair p = (t, j): gate = x_t . W13[e][i], up = x_t . W13[e][I + i], each rounded
//    to half, out[p][i] = half(act(gate)) * up (the layer's GEMM then silu_and_mul).
//  - moe_w4_gemv_down_sum_kernel<TL>, grid (T, ceil(H / rows per block)): the block's teams form
//    rows x expert groups; a team sums weights[t][j] * in[t][j] . W2[e_j][h] over its experts j,
//    the groups meet in shared memory: FP32 to the end, rounded once.
//  - moe_w4_dequantize_kernel: out[i] = W of expert experts[i] as half [N, K] (the all-experts
//    and gathered paths of larger batches).
#pragma once

#include <cuda_fp16.h>

#include "kernels/activation.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kMoeW4Threads = 128;

__device__ __forceinline__ __half2 moe_w4_as_half2(unsigned v) {
  __half2 h;
  *reinterpret_cast<unsigned*>(&h) = v;
  return h;
}

// The 8 weights of int32 q as 4 half2 of consecutive k, (q - z) * s with one rounding each:
// (bits | 0x6400) is the half 1024 + v (v < 1024), so subtracting 1024 + z is exact; the nibbles
// at bits 4..7 come out as 1024 + 16 v, scaled by 1/16 (exact) before the same subtraction.
__device__ __forceinline__ void moe_w4_dequant8(unsigned q, __half2 s2, __half2 nz1024, __half2 nz64,
                                                __half2 (&w)[4]) {
  constexpr unsigned kMagic = 0x64006400u, kLo = 0x000F000Fu, kHi = 0x00F000F0u;
  const __half2 sixteenth = __float2half2_rn(0.0625f);
  const unsigned q8 = q >> 8;
  w[0] = __hmul2(__hadd2(moe_w4_as_half2((q & kLo) | kMagic), nz1024), s2);
  w[1] = __hmul2(__hfma2(moe_w4_as_half2((q & kHi) | kMagic), sixteenth, nz64), s2);
  w[2] = __hmul2(__hadd2(moe_w4_as_half2((q8 & kLo) | kMagic), nz1024), s2);
  w[3] = __hmul2(__hfma2(moe_w4_as_half2((q8 & kHi) | kMagic), sixteenth, nz64), s2);
}

__device__ __forceinline__ unsigned moe_w4_bits(__half2 h) { return *reinterpret_cast<unsigned*>(&h); }

__device__ __forceinline__ unsigned moe_w4_word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// x (32 halves: 4 uint4) . the chunk's 32 weights: products summed in half2, returned in FP32.
__device__ __forceinline__ float moe_w4_chunk_dot(const uint4& qv, __half2 sz, const uint4 (&xv)[4]) {
  const __half2 z2 = __half2half2(__high2half(sz));
  const __half2 s2 = __half2half2(__low2half(sz));
  const __half2 nz1024 = __hneg2(__hadd2(z2, __float2half2_rn(1024.f)));
  const __half2 nz64 = __hneg2(__hadd2(z2, __float2half2_rn(64.f)));
  __half2 acc = __float2half2_rn(0.f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __half2 w[4];
    moe_w4_dequant8(moe_w4_word(qv, j), s2, nz1024, nz64, w);
    const __half2* x2 = reinterpret_cast<const __half2*>(&xv[j]);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc = __hfma2(w[i], x2[i], acc);
  }
  const float2 f = __half22float2(acc);
  return f.x + f.y;
}

// acc[r] += x . row r over this lane's chunks (lane, lane + TL, ...), NR rows sharing x; U chunks
// per row in flight (all loads issued before the math). `x` and the rows are 16-byte aligned;
// `sz[r]` the rows' group scales; chunk c's group is c / group_chunks.
template <int TL, int NR, int U>
__device__ __forceinline__ void moe_w4_rows_dot(const uint4* __restrict__ x, const uint4* const (&rows)[NR],
                                                const __half2* const (&sz)[NR], int chunks, int group_chunks,
                                                int lane, float (&acc)[NR]) {
  for (int c0 = lane; c0 < chunks; c0 += U * TL) {
    uint4 qv[U][NR];
#pragma unroll
    for (int s = 0; s < U; ++s) {
      const bool live = c0 + s * TL < chunks;
#pragma unroll
      for (int r = 0; r < NR; ++r) qv[s][r] = live ? rows[r][c0 + s * TL] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int s = 0; s < U; ++s) {
      const int c = c0 + s * TL;
      if (c >= chunks) break;
      uint4 xv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) xv[j] = x[4 * c + j];
      const int g = c / group_chunks;
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] += moe_w4_chunk_dot(qv[s][r], sz[r][g], xv);
    }
  }
}

// Sum over the TL lanes of a team (every lane of the warp calls it).
template <int TL>
__device__ __forceinline__ float moe_w4_team_sum(float v) {
#pragma unroll
  for (int offset = TL / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ int moe_w4_expert(const int* __restrict__ topk_ids, int64_t pair, int experts) {
  const int e = topk_ids[pair];
  return e >= 0 && e < experts ? e : 0;  // an out-of-range id reads expert 0, not stray memory
}

template <int TL, Activation A>
__global__ void __launch_bounds__(kMoeW4Threads)
    moe_w4_gemv_act_and_mul_kernel(__half* __restrict__ out, const __half* __restrict__ input,
                                   const int* __restrict__ qweight, const __half2* __restrict__ sz,
                                   const int* __restrict__ topk_ids, int top_k, int experts, int n, int k,
                                   int group_chunks) {
  constexpr int kTeams = kMoeW4Threads / TL;
  const int pair = blockIdx.x, team = threadIdx.x / TL, lane = threadIdx.x % TL;
  const int col = blockIdx.y * kTeams + team;
  const int c = min(col, n - 1);  // features past n repeat the last, not written
  const int t = pair / top_k;
  const int e = moe_w4_expert(topk_ids, pair, experts);
  const int chunks = k / 32, groups = chunks / group_chunks;
  const int64_t gate_row = static_cast<int64_t>(e) * 2 * n + c, up_row = gate_row + n;
  const uint4* rows[2] = {reinterpret_cast<const uint4*>(qweight + gate_row * (k / 8)),
                          reinterpret_cast<const uint4*>(qweight + up_row * (k / 8))};
  const __half2* szr[2] = {sz + gate_row * groups, sz + up_row * groups};
  float acc[2] = {0.f, 0.f};
  moe_w4_rows_dot<TL, 2, 2>(reinterpret_cast<const uint4*>(input + static_cast<int64_t>(t) * k), rows, szr, chunks,
                         group_chunks, lane, acc);
  const float gate = moe_w4_team_sum<TL>(acc[0]), up = moe_w4_team_sum<TL>(acc[1]);
  if (lane == 0 && col < n) {
    const float a = round_to<__half>(activate<A>(round_to<__half>(gate)));
    out[static_cast<int64_t>(pair) * n + col] = __float2half_rn(a * round_to<__half>(up));
  }
}

template <int TL>
__global__ void __launch_bounds__(kMoeW4Threads)
    moe_w4_gemv_down_sum_kernel(__half* __restrict__ out, const __half* __restrict__ input,
                                const int* __restrict__ qweight, const __half2* __restrict__ sz,
                                const int* __restrict__ topk_ids, const float* __restrict__ topk_weights, int top_k,
                                int experts, int n, int k, int group_chunks, int expert_groups) {
  constexpr int kTeams = kMoeW4Threads / TL;
  __shared__ float partial[kTeams];
  const int t = blockIdx.x, team = threadIdx.x / TL, lane = threadIdx.x % TL;
  const int rows_per_block = kTeams / expert_groups;
  const int r = team / expert_groups, g = team % expert_groups;
  const int row = blockIdx.y * rows_per_block + r;
  const int h = min(row, n - 1);
  const int chunks = k / 32, groups = chunks / group_chunks;
  float acc = 0.f;
  for (int j = g; j < top_k; j += expert_groups) {
    const int64_t pair = static_cast<int64_t>(t) * top_k + j;
    const int64_t w_row = static_cast<int64_t>(moe_w4_expert(topk_ids, pair, experts)) * n + h;
    const uint4* rows[1] = {reinterpret_cast<const uint4*>(qweight + w_row * (k / 8))};
    const __half2* szr[1] = {sz + w_row * groups};
    float part[1] = {0.f};
    moe_w4_rows_dot<TL, 1, 4>(reinterpret_cast<const uint4*>(input + pair * k), rows, szr, chunks, group_chunks, lane,
                           part);
    acc = fmaf(topk_weights[pair], part[0], acc);  // the weight scales this lane's share
  }
  acc = moe_w4_team_sum<TL>(acc);
  if (lane == 0) partial[team] = acc;
  __syncthreads();
  if (threadIdx.x < rows_per_block) {
    const int out_row = blockIdx.y * rows_per_block + threadIdx.x;
    float s = 0.f;
    for (int q = 0; q < expert_groups; ++q) s += partial[threadIdx.x * expert_groups + q];
    if (out_row < n) out[static_cast<int64_t>(t) * n + out_row] = __float2half_rn(s);
  }
}

// One thread per 32-value chunk: out [num, N, K] half of the listed experts.
__global__ void __launch_bounds__(256)
    moe_w4_dequantize_kernel(__half* __restrict__ out, const int* __restrict__ qweight,
                             const __half2* __restrict__ sz, const int* __restrict__ expert_list, int num, int experts,
                             int n, int k, int group_chunks) {
  const int chunks = k / 32, groups = chunks / group_chunks;
  const int64_t total = static_cast<int64_t>(num) * n * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % chunks);
    const int64_t row = i / chunks;  // over [num, N]
    const int slot = static_cast<int>(row / n), nn = static_cast<int>(row % n);
    int e = expert_list[slot];
    e = e >= 0 && e < experts ? e : 0;
    const int64_t w_row = static_cast<int64_t>(e) * n + nn;
    const uint4 qv = reinterpret_cast<const uint4*>(qweight + w_row * (k / 8))[c];
    const __half2 s = sz[w_row * groups + c / group_chunks];
    const __half2 z2 = __half2half2(__high2half(s)), s2 = __half2half2(__low2half(s));
    const __half2 nz1024 = __hneg2(__hadd2(z2, __float2half2_rn(1024.f)));
    const __half2 nz64 = __hneg2(__hadd2(z2, __float2half2_rn(64.f)));
    uint4* dst = reinterpret_cast<uint4*>(out + row * k + c * 32);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      __half2 w[4];
      moe_w4_dequant8(moe_w4_word(qv, j), s2, nz1024, nz64, w);
      dst[j] = make_uint4(moe_w4_bits(w[0]), moe_w4_bits(w[1]), moe_w4_bits(w[2]), moe_w4_bits(w[3]));
    }
  }
}

}  // namespace vllm_volta
