// Mixture-of-experts grouped GEMM on tensor cores (device code only): FP16 on SM70+ (WMMA
// m16n16k16, FP32 accumulation), BF16 on SM80+. The design of vLLM's fused-MoE kernel: the
// (token, expert) pairs come sorted by expert and padded per expert to a multiple of BM
// (moe_align_block_size), so every block of BM sorted rows belongs to one expert. Block (n, m)
// computes rows m*BM.. of the sorted pairs times columns n*BN.. of that expert's weight:
//   out[p][c] = (input[p / top_k] . weight[e][c]) (x weights[p] when given), p = sorted[row]
// Padding rows (p >= pairs) load zeros and are not written; blocks past num_post_pad, or whose
// expert is -1, return at once. The grid covers the worst-case padded length, so it depends only
// on the token count (CUDA-graph capturable, no host sync).
// Tiles: A [BM][BK] (gathered input rows) and B [BN][BK] (weight rows) staged in shared memory
// with 16-byte loads (the next K step's loads are issued before this step's MMAs); 4 warps, each
// an (BM / WARPS_M) x (BN / WARPS_N) block of 16 x 16 FP32 accumulators; the result goes through
// shared memory to the sorted rows' places.
#pragma once

#include <mma.h>

#include "kernels/type_convert.cuh"
#include "kernels/wmma_tiles.cuh"

namespace vllm_volta {

constexpr int kMoeGemmThreads = 128;
constexpr int kMoeGemmBN = 64;
constexpr int kMoeGemmBK = 32;
constexpr int kMoeGemmPad = 8;  // row padding (elements): rows stay 16-byte aligned, banks spread

template <typename T, int BM>
__device__ __forceinline__ void moe_gemm_body(T* __restrict__ out, const T* __restrict__ input,
                                              const T* __restrict__ weight, const int* __restrict__ sorted,
                                              const int* __restrict__ experts_ids,
                                              const int* __restrict__ num_post_pad,
                                              const float* __restrict__ topk_weights, int pairs, int top_k, int n,
                                              int k) {
  namespace wmma = nvcuda::wmma;
  constexpr int BN = kMoeGemmBN, BK = kMoeGemmBK, LD = BK + kMoeGemmPad, LDC = BN + 4;
  constexpr int WARPS_M = BM >= 32 ? 2 : 1, WARPS_N = 4 / WARPS_M;
  constexpr int FM = BM / (16 * WARPS_M), FN = BN / (16 * WARPS_N);
  constexpr int VK = BK / 8;                                 // 16-byte vectors per tile row
  constexpr int A_VECS = BM * VK, B_VECS = BN * VK;
  constexpr int A_LOADS = (A_VECS + kMoeGemmThreads - 1) / kMoeGemmThreads;  // per thread
  constexpr int B_LOADS = (B_VECS + kMoeGemmThreads - 1) / kMoeGemmThreads;
  static_assert(A_LOADS >= 1 && B_LOADS >= 1 && FM >= 1 && FN >= 1, "tile shape");
  __shared__ __align__(128) T a_tile[BM][LD];
  __shared__ __align__(128) T b_tile[BN][LD];
  __shared__ __align__(128) float c_tile[BM][LDC];

  const int m_block = blockIdx.y, row0 = m_block * BM, col0 = blockIdx.x * BN;
  if (row0 >= num_post_pad[0]) return;
  const int expert = experts_ids[m_block];
  if (expert < 0) return;

  // The rows this thread loads: A (a sorted pair's input row, or none) and B (a weight row).
  const uint4* a_src[A_LOADS];
  int a_row[A_LOADS], a_vec[A_LOADS];
#pragma unroll
  for (int i = 0; i < A_LOADS; ++i) {
    const int idx = threadIdx.x + i * kMoeGemmThreads;
    a_row[i] = idx < A_VECS ? idx / VK : -1;  // -1: this thread has no i-th vector (BM = 16)
    a_vec[i] = idx % VK;
    const int p = a_row[i] >= 0 ? sorted[row0 + a_row[i]] : pairs;
    a_src[i] = p < pairs ? reinterpret_cast<const uint4*>(input + static_cast<int64_t>(p / top_k) * k) : nullptr;
  }
  const uint4* b_src[B_LOADS];
  int b_row[B_LOADS], b_vec[B_LOADS];
#pragma unroll
  for (int i = 0; i < B_LOADS; ++i) {
    const int idx = threadIdx.x + i * kMoeGemmThreads;
    b_row[i] = idx < B_VECS ? idx / VK : -1;
    b_vec[i] = idx % VK;
    const int c = col0 + b_row[i];
    const int64_t row = static_cast<int64_t>(expert) * n + c;
    b_src[i] = b_row[i] >= 0 && c < n ? reinterpret_cast<const uint4*>(weight + row * k) : nullptr;
  }
  const int nvec = k / 8;
  uint4 a_reg[A_LOADS], b_reg[B_LOADS];
  auto load = [&](int k0) {  // k0: the step's first vector
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int v = k0 + a_vec[i];
      a_reg[i] = a_src[i] != nullptr && v < nvec ? a_src[i][v] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int v = k0 + b_vec[i];
      b_reg[i] = b_src[i] != nullptr && v < nvec ? b_src[i][v] : make_uint4(0u, 0u, 0u, 0u);
    }
  };

  const int warp = threadIdx.x / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  load(0);
  for (int k0 = 0; k0 < nvec; k0 += VK) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i)
      if (a_row[i] >= 0) *reinterpret_cast<uint4*>(&a_tile[a_row[i]][a_vec[i] * 8]) = a_reg[i];
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i)
      if (b_row[i] >= 0) *reinterpret_cast<uint4*>(&b_tile[b_row[i]][b_vec[i] * 8]) = b_reg[i];
    __syncthreads();
    if (k0 + VK < nvec) load(k0 + VK);  // in flight during the MMAs
    wmma_tile_k_step<T, FM, FN, BK, LD>(acc, a_tile, b_tile, wm, wn);
    __syncthreads();
  }
  wmma_store_tiles<FM, FN, LDC>(c_tile, acc, wm, wn);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kMoeGemmThreads) {
    const int r = idx / BN, c = idx % BN;
    const int p = sorted[row0 + r];
    if (p >= pairs || col0 + c >= n) continue;
    float y = c_tile[r][c];
    if (topk_weights != nullptr) y *= topk_weights[p];
    out[static_cast<int64_t>(p) * n + col0 + c] = Convert<T>::from_float(y);
  }
}

template <typename T, int BM>
__global__ void __launch_bounds__(kMoeGemmThreads)
    moe_grouped_gemm_kernel(T* __restrict__ out, const T* __restrict__ input, const T* __restrict__ weight,
                            const int* __restrict__ sorted, const int* __restrict__ experts_ids,
                            const int* __restrict__ num_post_pad, const float* __restrict__ topk_weights, int pairs,
                            int top_k, int n, int k) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    moe_gemm_body<T, BM>(out, input, weight, sorted, experts_ids, num_post_pad, topk_weights, pairs, top_k, n, k);
  }
}

}  // namespace vllm_volta
