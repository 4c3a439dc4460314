// Paged-attention decode (device code only): one query token per sequence attends to its
// whole context in the paged KV cache [2, num_blocks, block_size, num_kv_heads, D].
//
// Grid (num_heads / hpb, num_seqs, num_partitions). A block handles hpb query heads that
// share one KV head (GQA: K/V are read once for them; hpb <= HPB, the register bound the
// kernel is compiled for, so groups of 3, 5, 6 or 7 need no extra reads) over one partition of
// `partition_size` context tokens. Partitions past a sequence's length exit at once, so
// the grid may be sized from an upper bound (max_model_len under CUDA-graph capture).
//  1. scores: a group of L lanes reads one token's key row with 16-byte loads (U tokens
//     in flight per group) and reduces the dot products by warp shuffles;
//  2. softmax over the partition in shared memory (max, exp, sum);
//  3. P @ V: the same lane groups accumulate p * v in fp32 registers, reduced over the
//     groups of a warp by shuffles and over warps by shared-memory atomics.
// A sliding window (params.window > 0) starts the partitions at the window's first token rounded
// down to a multiple of kWindowAlign (whole 32-token tiles for the tensor-core kernel); the few
// tokens before the window in the first partition are masked. A soft cap (params.soft_cap > 0)
// turns each scaled score s into cap * tanh(s / cap) before the softmax.
// One partition: the normalized output is written directly. Several: the partition's
// unnormalized output, max and exp-sum go to fp32 scratch and a second kernel combines
// them (log-sum-exp rescaling). Everything is fp32 inside; FP16 uses no BF16 path.
// The cache element C is T, or an FP8 format (kernels/kv_fp8.cuh: decoded in software, 8
// elements per 8-byte load here); the host folds the key scale into params.scale and the value
// scale into params.v_scale.
#pragma once

#include "kernels/kv_fp8.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kPagedTokensInFlight = 4;  // U: tokens each lane group loads per iteration (8 measured slower)
constexpr float kNegLargest = -3.402823466e+38f;  // -FLT_MAX (no <cfloat> under NVRTC)

__host__ __device__ constexpr int pow2_ceil(int x) { return x <= 1 ? 1 : 2 * pow2_ceil((x + 1) / 2); }

// Lane layout of one head row of D elements of T for 16-byte vectors.
template <typename T, int D>
struct RowLanes {
  static constexpr int kVec = 16 / sizeof(T);                                  // elements per load
  static constexpr int kVecs = D / kVec;                                       // loads per row
  static constexpr int kLanes = kVecs >= 32 ? 32 : pow2_ceil(kVecs);          // lanes per token
  static constexpr int kPerLane = (kVecs + kLanes - 1) / kLanes;              // loads per lane
  static_assert(D % kVec == 0, "head size must be a multiple of 16 bytes");
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

constexpr int kWindowAlign = 32;

// The first context token a query at seq_len - 1 sees: seq_len - window with a window, else 0.
__host__ __device__ __forceinline__ int window_first(int seq_len, int window) {
  return window > 0 && seq_len > window ? seq_len - window : 0;
}
// Where the partitions of a sequence start: window_first rounded down to kWindowAlign.
__host__ __device__ __forceinline__ int context_base(int seq_len, int window) {
  return window_first(seq_len, window) / kWindowAlign * kWindowAlign;
}

// Before the softmax, when the launch has a window or a soft cap: score s[i] (times `scale`) of
// the partition's tokens becomes the capped score, or the lowest float for the tokens before
// the window (`skip` of them, from the partition start); the caller then uses a scale of 1.
// Lanes of a warp stride the partition, as the softmax does.
__device__ __forceinline__ void cap_and_mask_scores(float* s, int n, int skip, float scale, float cap, int lane) {
  for (int i = lane; i < n; i += 32) {
    const float x = s[i] * scale;
    s[i] = i < skip ? kNegLargest : (cap > 0.f ? cap * tanhf(x / cap) : x);
  }
  __syncwarp();
}

struct PagedDecodeParams {
  int num_heads;
  int num_kv_heads;
  int heads_per_block;     // hpb: query heads (of one KV head) per block, <= the kernel's HPB
  int block_size;
  int partition_size;
  int num_partitions;
  int64_t q_stride;        // elements between sequences in query (heads are D apart)
  int64_t bt_stride;       // elements between block-table rows
  int64_t num_slots;       // num_blocks * block_size: rows in one half of the cache
  float scale;
  int window;              // sliding window in tokens, 0 = the whole context
  float soft_cap;          // attention-logit soft cap, 0 = none
  float v_scale;           // multiplies P @ V: an FP8 cache's value scale (x its raw factor), else 1
};

// One 16-byte vector of cache elements -> floats (FP8: the raw decode; the scales are folded
// into the query and the output).
template <typename C, int N>
__device__ __forceinline__ void cache_to_float(const Vec<typename CacheStorage<C>::type, N>& in, float (&out)[N]) {
  if constexpr (is_fp8<C>::value) {
    static_assert(N % 4 == 0, "FP8 rows are read 4 bytes at a time");
    const unsigned* w = reinterpret_cast<const unsigned*>(in.v);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const unsigned lo = fp8x2_to_raw_half2<C, 0>(w[i]), hi = fp8x2_to_raw_half2<C, 1>(w[i]);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      out[4 * i] = a.x;
      out[4 * i + 1] = a.y;
      out[4 * i + 2] = b.x;
      out[4 * i + 3] = b.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = Convert<C>::to_float(in.v[j]);
  }
}

// EXACT: hpb == HPB (the group is 1, 2, 4 or 8), a compile-time constant; else hpb comes
// from the params and the heads past it are masked. C: the cache element (T or an FP8 format).
template <typename T, int D, int HPB, bool EXACT, typename C = T>
__global__ void paged_attention_decode_kernel(T* __restrict__ out, float* __restrict__ part_out,
                                              float* __restrict__ part_max, float* __restrict__ part_sum,
                                              const T* __restrict__ query,
                                              const typename CacheStorage<C>::type* __restrict__ kv_cache,
                                              const int* __restrict__ block_table,
                                              const int* __restrict__ seq_lens, PagedDecodeParams p) {
  pdl_launch_dependents();
  pdl_wait();  // the query and this step's keys / values come from the kernel before
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    using S = typename CacheStorage<C>::type;
    // Lanes as for 16-byte vectors of T; an FP8 cache is read 8 bytes (8 elements) per vector
    // then, so the registers per lane (queries, accumulators) are those of a 16-bit cache.
    using R = RowLanes<T, D>;
    using V = Vec<S, R::kVec>;
    using QV = Vec<T, R::kVec>;  // 16 bytes of queries
    constexpr int U = kPagedTokensInFlight;
    const int seq = blockIdx.y;
    const int part = blockIdx.z;
    const int seq_len = seq_lens[seq];
    const int start = context_base(seq_len, p.window) + part * p.partition_size;
    if (start >= seq_len) return;
    const int n = min(p.partition_size, seq_len - start);
    const int hpb = EXACT ? HPB : p.heads_per_block;
    const int head0 = blockIdx.x * hpb;
    const int kv_head = head0 / (p.num_heads / p.num_kv_heads);

    extern __shared__ float smem[];  // [HPB][partition_size] scores, then [HPB][D] output
    __shared__ float s_max[HPB];
    __shared__ float s_sum[HPB];
    const int lane = threadIdx.x % R::kLanes;
    const int group = threadIdx.x / R::kLanes;
    const int num_groups = blockDim.x / R::kLanes;
    const int warp = threadIdx.x / 32;
    const int num_warps = blockDim.x / 32;
    const int* bt = block_table + seq * p.bt_stride;
    const int64_t token_stride = static_cast<int64_t>(p.num_kv_heads) * D;
    const S* k_base = kv_cache + kv_head * D;
    const S* v_base = kv_cache + p.num_slots * token_stride + kv_head * D;

    // Element offset of context token i (of this partition) in one half of the cache.
    auto token_offset = [&](int i) -> int64_t {
      const int t = start + i;
      return (static_cast<int64_t>(bt[t / p.block_size]) * p.block_size + t % p.block_size) * token_stride;
    };

    // ---- 1. scores = scale * q . k ----
    float q[HPB][R::kPerLane][R::kVec];
#pragma unroll
    for (int h = 0; h < HPB; ++h) {
      const QV* qrow = reinterpret_cast<const QV*>(query + seq * p.q_stride + static_cast<int64_t>(head0 + h) * D);
#pragma unroll
      for (int c = 0; c < R::kPerLane; ++c) {
        const int vi = lane + c * R::kLanes;
        const bool live = h < hpb && vi < R::kVecs;  // heads past hpb: q = 0, never stored
        QV qv;
        if (live) qv = qrow[vi];
#pragma unroll
        for (int j = 0; j < R::kVec; ++j) q[h][c][j] = live ? Convert<T>::to_float(qv.v[j]) * p.scale : 0.f;
      }
    }
    // This lane's slices of the rows of tokens base + u * num_groups + group (u < U) of one
    // cache half: U independent 16-byte loads in flight per lane.
    auto load_rows = [&](const S* half_base, V (&rows)[U][R::kPerLane], int base) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * num_groups + group;
        if (i < n) {
          const V* row = reinterpret_cast<const V*>(half_base + token_offset(i));
#pragma unroll
          for (int c = 0; c < R::kPerLane; ++c)
            if (lane + c * R::kLanes < R::kVecs) rows[u][c] = row[lane + c * R::kLanes];
        }
      }
    };

    // Trip counts are uniform across the block (shuffles below need whole warps).
    for (int base = 0; base < n; base += num_groups * U) {
      V k[U][R::kPerLane];
      load_rows(k_base, k, base);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * num_groups + group;
        float dot[HPB];
#pragma unroll
        for (int h = 0; h < HPB; ++h) dot[h] = 0.f;
        if (i < n) {
#pragma unroll
          for (int c = 0; c < R::kPerLane; ++c) {
            if (lane + c * R::kLanes >= R::kVecs) continue;
            float kf[R::kVec];
            cache_to_float<C>(k[u][c], kf);
#pragma unroll
            for (int j = 0; j < R::kVec; ++j) {
#pragma unroll
              for (int h = 0; h < HPB; ++h) dot[h] += q[h][c][j] * kf[j];
            }
          }
        }
        // Reduce over the lanes of the group (aligned power-of-two lane ranges).
#pragma unroll
        for (int h = 0; h < HPB; ++h) {
#pragma unroll
          for (int offset = R::kLanes / 2; offset > 0; offset >>= 1)
            dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], offset);
          if (i < n && lane == 0 && h < hpb) smem[h * p.partition_size + i] = dot[h];
        }
      }
    }
    __syncthreads();

    // ---- 2. softmax over the partition: one warp per head ----
    const int skip = window_first(seq_len, p.window) - start;  // > 0: the first partition only
    for (int h = warp; h < hpb; h += num_warps) {
      float* s = smem + h * p.partition_size;
      if (skip > 0 || p.soft_cap > 0.f) cap_and_mask_scores(s, n, skip, 1.f, p.soft_cap, threadIdx.x % 32);
      float m = kNegLargest;
      for (int i = threadIdx.x % 32; i < n; i += 32) m = fmaxf(m, s[i]);
      m = warp_max(m);
      float sum = 0.f;
      for (int i = threadIdx.x % 32; i < n; i += 32) {
        const float e = __expf(s[i] - m);
        s[i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (threadIdx.x % 32 == 0) {
        s_max[h] = m;
        s_sum[h] = sum;
      }
    }
    __syncthreads();

    // ---- 3. out = P @ V ----
    float acc[HPB][R::kPerLane][R::kVec];
#pragma unroll
    for (int h = 0; h < HPB; ++h)
#pragma unroll
      for (int c = 0; c < R::kPerLane; ++c)
#pragma unroll
        for (int j = 0; j < R::kVec; ++j) acc[h][c][j] = 0.f;
    for (int base = 0; base < n; base += num_groups * U) {
      V v[U][R::kPerLane];
      load_rows(v_base, v, base);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * num_groups + group;
        if (i >= n) continue;
        float prob[HPB];
#pragma unroll
        for (int h = 0; h < HPB; ++h) prob[h] = h < hpb ? smem[h * p.partition_size + i] : 0.f;
#pragma unroll
        for (int c = 0; c < R::kPerLane; ++c) {
          if (lane + c * R::kLanes >= R::kVecs) continue;
          float vf[R::kVec];
          cache_to_float<C>(v[u][c], vf);
#pragma unroll
          for (int j = 0; j < R::kVec; ++j) {
#pragma unroll
            for (int h = 0; h < HPB; ++h) acc[h][c][j] += prob[h] * vf[j];
          }
        }
      }
    }
    // Sum over the lane groups of each warp (same lane index = same elements).
#pragma unroll
    for (int h = 0; h < HPB; ++h)
#pragma unroll
      for (int c = 0; c < R::kPerLane; ++c)
#pragma unroll
        for (int j = 0; j < R::kVec; ++j)
#pragma unroll
          for (int offset = R::kLanes; offset < 32; offset <<= 1)
            acc[h][c][j] += __shfl_xor_sync(0xffffffffu, acc[h][c][j], offset);
    __syncthreads();  // scores no longer needed: reuse smem for the [HPB][D] output
    for (int idx = threadIdx.x; idx < HPB * D; idx += blockDim.x) smem[idx] = 0.f;
    __syncthreads();
    if (threadIdx.x % 32 < R::kLanes) {
#pragma unroll
      for (int h = 0; h < HPB; ++h)
#pragma unroll
        for (int c = 0; c < R::kPerLane; ++c) {
          const int vi = lane + c * R::kLanes;
          if (vi >= R::kVecs || h >= hpb) continue;
#pragma unroll
          for (int j = 0; j < R::kVec; ++j) atomicAdd(&smem[h * D + vi * R::kVec + j], acc[h][c][j]);
        }
    }
    __syncthreads();

    if (p.num_partitions == 1) {
      for (int idx = threadIdx.x; idx < hpb * D; idx += blockDim.x) {
        const int h = idx / D;
        out[(static_cast<int64_t>(seq) * p.num_heads + head0 + h) * D + idx % D] =
            Convert<T>::from_float(smem[idx] * p.v_scale / s_sum[h]);
      }
    } else {
      for (int idx = threadIdx.x; idx < hpb * D; idx += blockDim.x) {
        const int h = idx / D;
        const int64_t row = (static_cast<int64_t>(seq) * p.num_heads + head0 + h) * p.num_partitions + part;
        part_out[row * D + idx % D] = smem[idx] * p.v_scale;
        if (idx % D == 0) {
          part_max[row] = s_max[h];
          part_sum[row] = s_sum[h];
        }
      }
    }
  }
}

// Combines the partitions of each (sequence, head): grid (num_heads, num_seqs). Each
// partition's output is rescaled by exp(its max - global max) and the sum renormalized.
// The partitions are read kReduceChunk at a time with all their loads issued together (a
// loop of dependent one-at-a-time loads made this kernel latency-bound at short contexts);
// the sums run in partition order as before, so the result is the same bits.
constexpr int kReduceChunk = 8;

template <typename T>
__global__ void paged_attention_reduce_kernel(T* __restrict__ out, const float* __restrict__ part_out,
                                              const float* __restrict__ part_max,
                                              const float* __restrict__ part_sum,
                                              const int* __restrict__ seq_lens, int head_size,
                                              int partition_size, int num_partitions, int window) {
  pdl_launch_dependents();
  pdl_wait();  // the partitions' results come from the attention kernel before
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int head = blockIdx.x;
    const int seq = blockIdx.y;
    const int64_t row = static_cast<int64_t>(seq) * gridDim.x + head;
    const int span = seq_lens[seq] - context_base(seq_lens[seq], window);
    const int used = min(num_partitions, (span + partition_size - 1) / partition_size);
    const float* maxes = part_max + row * num_partitions;
    const float* sums = part_sum + row * num_partitions;
    float m = kNegLargest;
    for (int base = 0; base < used; base += kReduceChunk) {  // few partitions: every thread
      float mv[kReduceChunk];
#pragma unroll
      for (int j = 0; j < kReduceChunk; ++j) mv[j] = base + j < used ? maxes[base + j] : kNegLargest;
#pragma unroll
      for (int j = 0; j < kReduceChunk; ++j) m = fmaxf(m, mv[j]);
    }
    const float* src = part_out + row * num_partitions * head_size;
    for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
      float o = 0.f, total = 0.f;
      for (int base = 0; base < used; base += kReduceChunk) {
        float mv[kReduceChunk], sv[kReduceChunk], ov[kReduceChunk];
#pragma unroll
        for (int j = 0; j < kReduceChunk; ++j) {
          const int i = base + j;
          const bool live = i < used;  // past it: weight 1, sum and output 0 (adds nothing)
          mv[j] = live ? maxes[i] : m;
          sv[j] = live ? sums[i] : 0.f;
          ov[j] = live ? src[static_cast<int64_t>(i) * head_size + d] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < kReduceChunk; ++j) {
          const float w = __expf(mv[j] - m);
          total += sv[j] * w;
          o += ov[j] * w;
        }
      }
      const float inv_total = total > 0.f ? 1.f / total : 0.f;  // empty context -> zeros
      out[row * head_size + d] = Convert<T>::from_float(o * inv_total);
    }
  }
}

}  // namespace vllm_volta
