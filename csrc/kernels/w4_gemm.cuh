// W4A16 GEMM on tensor cores (device code only): out [M, N] = x [M, K] W, W in the K-major 4-bit
// layout of kernels/w4.cuh, FP16 WMMA m16n16k16 with FP32 accumulation (SM70 and newer).
// Block (n, m, split): output rows m*BM.., columns n*BN.., K steps of kW4GemmBK taken by the
// split (grid.z). Per K step each thread loads 16-byte vectors of x (A tile, [BM][BK] row-major)
// and of the packed weight (32 k of one output column), dequantizes the weight in registers
// (w4_dequant8) into the B tile ([BN][BK]: col-major B), the next step's loads in flight during
// the MMAs. 4 warps, each (BM / WARPS_M) x (BN / WARPS_N) of 16 x 16 FP32 accumulators; the
// result goes through shared memory (aliasing the tiles) to out as half (one split) or to FP32
// partials [split][M][N] that awq_reduce_kernel sums (several splits). Rows past M and K chunks
// past K load zeros; columns past N are neither loaded nor written.
#pragma once

#include <mma.h>

#include "kernels/w4.cuh"
#include "kernels/wmma_tiles.cuh"

namespace vllm_volta {

constexpr int kW4GemmThreads = 128;
constexpr int kW4GemmBK = 64;
constexpr int kW4GemmPad = 8;  // halves: rows stay 16-byte aligned, banks spread

template <int BM, int BN>
struct W4GemmSmem {
  static constexpr int LD = kW4GemmBK + kW4GemmPad, LDC = BN + 4;
  static constexpr int kTiles = (BM + BN) * LD * 2, kC = BM * LDC * 4;
  static constexpr int kBytes = kTiles > kC ? kTiles : kC;
};

template <int BM, int BN>
__global__ void __launch_bounds__(kW4GemmThreads)
    w4_gemm_kernel(__half* __restrict__ out, float* __restrict__ partial, const __half* __restrict__ x,
                   const uint4* __restrict__ qweight, const __half2* __restrict__ sz, int m_rows, int n, int k,
                   int groups, int group_shift, int steps_per_split) {
  namespace wmma = nvcuda::wmma;
  using S = W4GemmSmem<BM, BN>;
  constexpr int BK = kW4GemmBK, LD = S::LD, LDC = S::LDC;
  constexpr int WARPS_M = BM >= 32 ? 2 : 1, WARPS_N = 4 / WARPS_M;
  constexpr int FM = BM / (16 * WARPS_M), FN = BN / (16 * WARPS_N);
  constexpr int AV = BK / 8, BV = BK / 32;  // 16-byte vectors per tile row: x (8 halves), w (32 k)
  constexpr int A_LOADS = (BM * AV + kW4GemmThreads - 1) / kW4GemmThreads;
  constexpr int B_LOADS = (BN * BV + kW4GemmThreads - 1) / kW4GemmThreads;
  static_assert(FM >= 1 && FN >= 1 && A_LOADS >= 1 && B_LOADS >= 1, "tile shape");
  __shared__ __align__(128) unsigned char smem[S::kBytes];
  auto a_tile = reinterpret_cast<__half(*)[LD]>(smem);
  auto b_tile = reinterpret_cast<__half(*)[LD]>(smem + BM * LD * 2);
  auto c_tile = reinterpret_cast<float(*)[LDC]>(smem);  // after the last MMA only

  pdl_launch_dependents();
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  const int chunks = k / 32, x_vecs = k / 8;
  const int step0 = blockIdx.z * steps_per_split;
  const int steps = min(steps_per_split, (chunks * 32 + BK - 1) / BK - step0);

  // This thread's vectors: A (row, vector in the row) and B (column, 32-k chunk in the row).
  int a_row[A_LOADS], a_vec[A_LOADS], b_col[B_LOADS], b_vec[B_LOADS];
#pragma unroll
  for (int i = 0; i < A_LOADS; ++i) {
    const int idx = threadIdx.x + i * kW4GemmThreads;
    a_row[i] = idx < BM * AV ? idx / AV : -1;
    a_vec[i] = idx % AV;
  }
#pragma unroll
  for (int i = 0; i < B_LOADS; ++i) {
    const int idx = threadIdx.x + i * kW4GemmThreads;
    b_col[i] = idx < BN * BV && col0 + idx / BV < n ? idx / BV : -1;
    b_vec[i] = idx % BV;
  }
  uint4 a_reg[A_LOADS], b_reg[B_LOADS];
  __half2 b_sz[B_LOADS];
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  auto load_b = [&](int step) {
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int c = step * BV + b_vec[i];
      const bool live = b_col[i] >= 0 && c < chunks;
      const int64_t col = col0 + (b_col[i] < 0 ? 0 : b_col[i]);
      b_reg[i] = live ? __ldg(qweight + col * chunks + c) : zero4;
      b_sz[i] = live ? __ldg(sz + col * groups + (c >> group_shift)) : __float2half2_rn(0.f);
    }
  };
  auto load_a = [&](int step) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int v = step * AV + a_vec[i], row = row0 + a_row[i];
      a_reg[i] = a_row[i] >= 0 && row < m_rows && v < x_vecs
                     ? __ldg(reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(row) * x_vecs + v)
                     : zero4;
    }
  };

  const int warp = threadIdx.x / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  if (steps > 0) load_b(step0);  // weights first: they do not depend on the kernel before
  pdl_wait();
  if (steps > 0) load_a(step0);
  for (int s = 0; s < steps; ++s) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i)
      if (a_row[i] >= 0) *reinterpret_cast<uint4*>(&a_tile[a_row[i]][a_vec[i] * 8]) = a_reg[i];
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int idx = threadIdx.x + i * kW4GemmThreads;
      if (idx >= BN * BV) continue;
      __align__(16) __half2 w[4][4];
      if (b_col[i] >= 0) {
        const W4Group g = w4_group(b_sz[i]);
#pragma unroll
        for (int j = 0; j < 4; ++j) w4_dequant8(w4_word(b_reg[i], j), g, w[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int p = 0; p < 4; ++p) w[j][p] = __float2half2_rn(0.f);
      }
      uint4* dst = reinterpret_cast<uint4*>(&b_tile[idx / BV][b_vec[i] * 32]);
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[j] = *reinterpret_cast<const uint4*>(w[j]);
    }
    __syncthreads();
    if (s + 1 < steps) {  // in flight during the MMAs
      load_b(step0 + s + 1);
      load_a(step0 + s + 1);
    }
    wmma_tile_k_step<__half, FM, FN, BK, LD>(acc, a_tile, b_tile, wm, wn);
    __syncthreads();
  }
  wmma_store_tiles<FM, FN, LDC>(c_tile, acc, wm, wn);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kW4GemmThreads) {
    const int r = idx / BN, c = idx % BN;
    if (row0 + r >= m_rows || col0 + c >= n) continue;
    const int64_t o = static_cast<int64_t>(row0 + r) * n + col0 + c;
    if (partial != nullptr) {
      partial[static_cast<int64_t>(blockIdx.z) * m_rows * n + o] = c_tile[r][c];
    } else {
      out[o] = __float2half_rn(c_tile[r][c]);
    }
  }
}

}  // namespace vllm_volta
