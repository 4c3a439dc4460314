// Paged-attention decode on tensor cores (device code only), FP16 (SM70+) and BF16 (SM80+):
// the same contract, grid and partition scratch as paged_attention_decode_kernel
// (paged_attention.cuh), with both products done by WMMA m8n32k16 (16-bit inputs, FP32
// accumulation):
//  1. each warp stages 32 context tokens' key rows in shared memory (16-byte loads, all in
//     flight at once; the next tile's loads are issued before this tile's MMAs; a whole tile
//     is addressed from two block-table reads, not one shuffled slot per row) and computes
//     the 8 x 32 block of scores Q (8 query heads, rows past hpb zero; held in registers as MMA
//     operands for the whole partition; two accumulators, even / odd k) x K^T; its hpb real
//     rows go to the FP32 scores [hpb][partition] (through the warp's free tile buffer, so
//     the partition-long buffer holds no zero rows: less shared memory, more blocks per SM);
//  2. softmax over the partition (one warp per head);
//  3. each warp stages 32 value rows, converts its 8 x 32 probabilities to FP16 / BF16 and
//     accumulates P x V into 8 x D FP32 fragments; the warps' partial outputs are summed in
//     shared memory.
// No lane-group shuffles or per-element FMAs: the CUDA cores only move data and run the
// softmax (the CUDA-core kernel was bound by issuing those instructions).
// An FP8 cache (C = Fp8E4M3 / Fp8E5M2) is read 16 elements per 16-byte load and decoded to
// FP16 / BF16 (raw: the scales are folded into params.scale and params.v_scale) as the tile is
// staged, so the MMAs and the shared-memory layout are the same as for a 16-bit cache.
#pragma once

#include <mma.h>

#include "kernels/paged_attention.cuh"

namespace vllm_volta {

constexpr int kTcTile = 32;  // context tokens per warp tile (N of the score MMA)
constexpr int kTcRows = 8;   // query rows of the MMA (M): the block's heads, hpb <= 8

// Row strides padded past a multiple of 32 banks, so the rows of an MMA fragment do not
// all fall on the same shared-memory banks.
__host__ __device__ constexpr int tc_stage_stride(int d) { return d + 8; }       // K/V tile, halves
__host__ __device__ constexpr int tc_score_stride(int p) { return p + 8; }       // scores, floats
constexpr int kTcProbStride = kTcTile + 8;                                        // probabilities, halves

// Dynamic shared memory of paged_attention_decode_tc_kernel<D> with `warps` warps and hpb
// heads per block.
__host__ __device__ constexpr int64_t tc_smem_bytes(int d, int warps, int partition_size, int hpb) {
  return 2LL * kTcRows * d                                   // queries [8][D] half
         + 4LL * hpb * tc_score_stride(partition_size)       // scores / exps [hpb][P + 8] float
         + 2LL * warps * kTcTile * tc_stage_stride(d)        // per-warp K/V tile [32][D + 8] half
         + 2LL * warps * kTcRows * kTcProbStride             // per-warp probabilities [8][40] half
         + 4LL * 2 * kTcRows;                                // max, sum per head
}

// Eight FP8 bytes (one 8-byte word pair) -> eight staged elements of T (one 16-byte vector).
template <typename T, typename Fmt>
__device__ __forceinline__ uint4 fp8x8_to_staged(unsigned w0, unsigned w1) {
  unsigned h[4] = {fp8x2_to_raw_half2<Fmt, 0>(w0), fp8x2_to_raw_half2<Fmt, 1>(w0), fp8x2_to_raw_half2<Fmt, 0>(w1),
                   fp8x2_to_raw_half2<Fmt, 1>(w1)};
  if constexpr (!same_type<T, __half>::value) {  // BF16 (SM80+): FP8 values are exact in BF16 too
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(*reinterpret_cast<const __half2*>(&h[i])));
      h[i] = *reinterpret_cast<const unsigned*>(&b);
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// The kernel's body for T = __half (SM70+) or __nv_bfloat16 (SM80+); C: the cache element (T
// or an FP8 format).
template <typename T, int D, typename C = T>
__device__ __forceinline__ void paged_attention_decode_tc(T* __restrict__ out, float* __restrict__ part_out,
                                                          float* __restrict__ part_max, float* __restrict__ part_sum,
                                                          const T* __restrict__ query,
                                                          const typename CacheStorage<C>::type* __restrict__ kv_cache,
                                                          const int* __restrict__ block_table,
                                                          const int* __restrict__ seq_lens, const PagedDecodeParams& p) {
  namespace wmma = nvcuda::wmma;
  using S = typename CacheStorage<C>::type;
  constexpr bool kFp8 = is_fp8<C>::value;
  constexpr int LDS = tc_stage_stride(D);
  constexpr int kPerVec = 16 / sizeof(S);  // cache elements per 16-byte load (8, or 16 for FP8)
  constexpr int VR = D / kPerVec;          // 16-byte loads per cache row
  static_assert(D % 32 == 0, "head size must be a multiple of 32");
  const int seq = blockIdx.y;
  const int seq_len = seq_lens[seq];
  const int start = context_base(seq_len, p.window) + blockIdx.z * p.partition_size;  // a whole tile
  if (start >= seq_len) return;
  const int n = min(p.partition_size, seq_len - start);
  const int hpb = p.heads_per_block;
  const int head0 = blockIdx.x * hpb;
  const int kv_head = head0 / (p.num_heads / p.num_kv_heads);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  const int SP = tc_score_stride(p.partition_size);

  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* q_s = reinterpret_cast<T*>(tc_smem);
  float* scores = reinterpret_cast<float*>(q_s + kTcRows * D);
  T* stage_all = reinterpret_cast<T*>(scores + hpb * SP);  // 32-byte aligned: SP % 8 == 0
  T* probs_all = stage_all + num_warps * kTcTile * LDS;
  float* s_max = reinterpret_cast<float*>(probs_all + num_warps * kTcRows * kTcProbStride);
  float* s_sum = s_max + kTcRows;
  T* stage = stage_all + warp * kTcTile * LDS;
  T* probs = probs_all + warp * kTcRows * kTcProbStride;

  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  constexpr int QVR = D / 8;  // 16-byte vectors per query row (queries are T, whatever the cache)
  for (int idx = threadIdx.x; idx < kTcRows * QVR; idx += blockDim.x) {
    const int h = idx / QVR, c = idx % QVR;
    uint4 v = zero;
    if (h < hpb) v = *reinterpret_cast<const uint4*>(query + seq * p.q_stride + static_cast<int64_t>(head0 + h) * D + c * 8);
    *reinterpret_cast<uint4*>(q_s + h * D + c * 8) = v;
  }

  const int* bt = block_table + seq * p.bt_stride;
  const int64_t token_stride = static_cast<int64_t>(p.num_kv_heads) * D;
  const S* k_base = kv_cache + kv_head * D;
  const S* v_base = kv_cache + p.num_slots * token_stride + kv_head * D;

  // Rows i0 .. i0 + 31 of one cache half, as this lane's VR 16-byte vectors of the tile
  // (rows past n: zeros). A whole tile with block_size a multiple of 16 is two runs of 16
  // consecutive slots (the tile starts at a multiple of 32 tokens): two block-table reads
  // and plain address arithmetic. Otherwise lane l finds the cache slot of row l and shares it.
  const bool runs16 = p.block_size % 16 == 0;
  auto load_rows = [&](uint4 (&vals)[VR], const S* cache_half, int i0) {
    if (runs16 && i0 + kTcTile <= n) {
      const int t0 = start + i0, t1 = t0 + 16;
      const S* run0 = cache_half + static_cast<int64_t>(bt[t0 / p.block_size] * p.block_size + t0 % p.block_size) * token_stride;
      const S* run1 = cache_half + static_cast<int64_t>(bt[t1 / p.block_size] * p.block_size + t1 % p.block_size) * token_stride;
#pragma unroll
      for (int r = 0; r < VR; ++r) {
        const int v = lane + 32 * r, row = v / VR;
        const S* src = (row < 16 ? run0 + row * token_stride : run1 + (row - 16) * token_stride) + (v % VR) * kPerVec;
        vals[r] = *reinterpret_cast<const uint4*>(src);
      }
      return;
    }
    const int i = i0 + lane;
    int slot = -1;
    if (i < n) {
      const int t = start + i;
      slot = bt[t / p.block_size] * p.block_size + t % p.block_size;
    }
#pragma unroll
    for (int r = 0; r < VR; ++r) {
      const int v = lane + 32 * r;
      const int s = __shfl_sync(0xffffffffu, slot, v / VR);
      vals[r] = s >= 0 ? *reinterpret_cast<const uint4*>(cache_half + s * token_stride + (v % VR) * kPerVec) : zero;
    }
  };
  auto store_rows = [&](const uint4 (&vals)[VR]) {
#pragma unroll
    for (int r = 0; r < VR; ++r) {
      const int v = lane + 32 * r;
      T* dst = stage + (v / VR) * LDS + (v % VR) * kPerVec;
      if constexpr (kFp8) {  // 16 bytes -> two 16-byte vectors of T
        *reinterpret_cast<uint4*>(dst) = fp8x8_to_staged<T, C>(vals[r].x, vals[r].y);
        *reinterpret_cast<uint4*>(dst + 8) = fp8x8_to_staged<T, C>(vals[r].z, vals[r].w);
      } else {
        *reinterpret_cast<uint4*>(dst) = vals[r];
      }
    }
  };
  __syncthreads();  // queries staged

  // ---- 1. scores = Q K^T (unscaled), [8][P] ----
  // Both loops are software-pipelined: the next tile's loads are issued as soon as this
  // tile is in shared memory, so they are in flight during the MMAs.
  // The queries as MMA operands, loaded once (not once per tile).
  wmma::fragment<wmma::matrix_a, kTcRows, kTcTile, 16, T, wmma::row_major> qf[D / 16];
#pragma unroll
  for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(qf[k], q_s + k * 16, D);
  const int num_tiles = (n + kTcTile - 1) / kTcTile;
  uint4 vals[VR];
  if (warp < num_tiles) load_rows(vals, k_base, warp * kTcTile);
  for (int tile = warp; tile < num_tiles; tile += num_warps) {
    store_rows(vals);
    __syncwarp();
    if (tile + num_warps < num_tiles) load_rows(vals, k_base, (tile + num_warps) * kTcTile);
    // Two accumulators (even / odd k) halve the dependent MMA chain.
    wmma::fragment<wmma::accumulator, kTcRows, kTcTile, 16, float> acc, acc_odd;
    wmma::fill_fragment(acc, 0.f);
    wmma::fill_fragment(acc_odd, 0.f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      wmma::fragment<wmma::matrix_b, kTcRows, kTcTile, 16, T, wmma::col_major> b;
      wmma::load_matrix_sync(b, stage + k * 16, LDS);
      if (k % 2 == 0) wmma::mma_sync(acc, qf[k], b, acc);
      else wmma::mma_sync(acc_odd, qf[k], b, acc_odd);
    }
#pragma unroll
    for (int e = 0; e < acc.num_elements; ++e) acc.x[e] += acc_odd.x[e];
    // The 8 x 32 block goes through the warp's tile buffer (free once every lane's MMA
    // inputs are loaded); only the hpb real rows are kept.
    float* block = reinterpret_cast<float*>(stage);
    __syncwarp();
    wmma::store_matrix_sync(block, acc, kTcTile, wmma::mem_row_major);
    __syncwarp();
    for (int h = 0; h < hpb; ++h) scores[h * SP + tile * kTcTile + lane] = block[h * kTcTile + lane];
    __syncwarp();  // the tile is restaged next iteration
  }
  if (warp < num_tiles) load_rows(vals, v_base, warp * kTcTile);  // in flight during the softmax
  __syncthreads();

  // ---- 2. softmax over the partition: one warp per head; exps replace the scores ----
  const int skip = window_first(seq_len, p.window) - start;  // > 0: the first partition only
  const bool transform = skip > 0 || p.soft_cap > 0.f;
  const float scale = transform ? 1.f : p.scale;  // transformed scores are scaled already
  for (int h = warp; h < hpb; h += num_warps) {
    float* s = scores + h * SP;
    if (transform) cap_and_mask_scores(s, n, skip, p.scale, p.soft_cap, lane);
    float m = kNegLargest;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, s[i] * scale);
    m = warp_max(m);
    float sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float e = __expf(s[i] * scale - m);
      s[i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      s_max[h] = m;
      s_sum[h] = sum;
    }
  }
  __syncthreads();

  // ---- 3. out = P V: [8][D] per warp, then summed over the warps ----
  wmma::fragment<wmma::accumulator, kTcRows, kTcTile, 16, float> o[D / kTcTile];
#pragma unroll
  for (int c = 0; c < D / kTcTile; ++c) wmma::fill_fragment(o[c], 0.f);
  for (int tile = warp; tile < num_tiles; tile += num_warps) {
    store_rows(vals);
    if (tile + num_warps < num_tiles) load_rows(vals, v_base, (tile + num_warps) * kTcTile);
    for (int idx = lane; idx < kTcRows * kTcTile; idx += 32) {
      const int h = idx / kTcTile, t = idx % kTcTile, i = tile * kTcTile + t;
      probs[h * kTcProbStride + t] = Convert<T>::from_float(h < hpb && i < n ? scores[h * SP + i] : 0.f);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kTcTile / 16; ++k) {
      wmma::fragment<wmma::matrix_a, kTcRows, kTcTile, 16, T, wmma::row_major> a;
      wmma::load_matrix_sync(a, probs + k * 16, kTcProbStride);
#pragma unroll
      for (int c = 0; c < D / kTcTile; ++c) {
        wmma::fragment<wmma::matrix_b, kTcRows, kTcTile, 16, T, wmma::row_major> b;
        wmma::load_matrix_sync(b, stage + k * 16 * LDS + c * kTcTile, LDS);
        wmma::mma_sync(o[c], a, b, o[c]);
      }
    }
    __syncwarp();
  }
  __syncthreads();  // every warp is done with its tile: reuse the tiles for [warps][8][D]
  float* red = reinterpret_cast<float*>(stage_all);
#pragma unroll
  for (int c = 0; c < D / kTcTile; ++c)
    wmma::store_matrix_sync(red + warp * kTcRows * D + c * kTcTile, o[c], D, wmma::mem_row_major);
  __syncthreads();

  for (int idx = threadIdx.x; idx < hpb * D; idx += blockDim.x) {
    float o_sum = 0.f;
    for (int w = 0; w < num_warps; ++w) o_sum += red[w * kTcRows * D + idx];
    const int h = idx / D;
    if (p.num_partitions == 1) {
      out[(static_cast<int64_t>(seq) * p.num_heads + head0 + h) * D + idx % D] =
          Convert<T>::from_float(o_sum * p.v_scale / s_sum[h]);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * p.num_heads + head0 + h) * p.num_partitions + blockIdx.z;
      part_out[row * D + idx % D] = o_sum * p.v_scale;
      if (idx % D == 0) {
        part_max[row] = s_max[h];
        part_sum[row] = s_sum[h];
      }
    }
  }
}

template <typename T, int D, typename C = T>
__global__ void paged_attention_decode_tc_kernel(T* __restrict__ out, float* __restrict__ part_out,
                                                 float* __restrict__ part_max, float* __restrict__ part_sum,
                                                 const T* __restrict__ query,
                                                 const typename CacheStorage<C>::type* __restrict__ kv_cache,
                                                 const int* __restrict__ block_table,
                                                 const int* __restrict__ seq_lens, PagedDecodeParams p) {
  pdl_launch_dependents();
  pdl_wait();  // the query and this step's keys / values come from the kernel before
  if constexpr (arch_supports<T>::value)
    paged_attention_decode_tc<T, D, C>(out, part_out, part_max, part_sum, query, kv_cache, block_table, seq_lens, p);
  else
    __trap();  // bf16 below SM80: refused by the host before launching
}

}  // namespace vllm_volta
