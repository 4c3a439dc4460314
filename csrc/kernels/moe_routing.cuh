// Mixture-of-experts routing on the device (device code only, SM70+):
//  - topk_kernel: each token's router scores (softmax over the experts, or a per-expert sigmoid)
//    in FP32 and its top_k experts, largest score first (equal scores: the lower expert id).
//    One warp per token; the scores sit in shared memory while the k winners are picked one
//    warp-wide argmax at a time. A NaN score ranks below every number but is still a valid
//    choice, so every id written is in [0, E) whatever the input (the padded rows of a CUDA
//    graph route somewhere harmless).
//  - moe_align_block_size_kernel: the (token, expert) pairs in expert order, each expert's run
//    padded to a multiple of block_size with the pair count (an id past every pair), and the
//    expert of each block: the input of the grouped GEMM. One block; counts in shared memory.
//  - moe_sum_kernel: out[t] = sum_j in[t, j] in FP32, rounded once.
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kTopkWarps = 4;             // tokens per block of topk_kernel
constexpr int kTopkMaxExperts = 1024;     // kMoeMaxExperts (moe_checks.h)
constexpr int kAlignThreads = 1024;

enum class MoeScore { kSoftmax, kSigmoid };

// Ranking key of a score: taken -2, NaN -1 (below every number, above taken), else the score.
__device__ __forceinline__ float topk_key(float s) { return isnan(s) ? -1.f : s; }

template <typename T, MoeScore S>
__global__ void __launch_bounds__(kTopkWarps * 32)
    topk_kernel(float* __restrict__ topk_weights, int* __restrict__ topk_ids, int* __restrict__ token_expert_indices,
                const T* __restrict__ gating, int tokens, int experts, int top_k) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    __shared__ float scores[kTopkWarps][kTopkMaxExperts];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x * kTopkWarps + warp;
    if (t >= tokens) return;  // whole warps leave; no block-wide sync below
    float* s = scores[warp];
    const T* row = gating + static_cast<int64_t>(t) * experts;
    float mx = -3.402823466e38f;  // -FLT_MAX (NVRTC has no <cfloat>); expf(-FLT_MAX - x) is 0 as -inf's
    for (int e = lane; e < experts; e += 32) {
      const float x = Convert<T>::to_float(row[e]);
      s[e] = x;
      mx = fmaxf(mx, x);
    }
    if constexpr (S == MoeScore::kSoftmax) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      float sum = 0.f;
      for (int e = lane; e < experts; e += 32) {
        const float p = expf(s[e] - mx);
        s[e] = p;
        sum += p;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float inv = 1.f / sum;
      for (int e = lane; e < experts; e += 32) s[e] *= inv;
    } else {
      for (int e = lane; e < experts; e += 32) s[e] = 1.f / (1.f + expf(-s[e]));
    }
    __syncwarp();
    for (int j = 0; j < top_k; ++j) {
      float best = -1.5f, value = 0.f;  // -1.5: below NaN's key, above taken
      int best_e = experts;
      for (int e = lane; e < experts; e += 32) {
        const float v = s[e];
        if (v == -2.f) continue;  // taken (scores are >= 0 or NaN)
        const float key = topk_key(v);
        if (key > best) {  // lanes visit ascending ids: ties keep the lower one
          best = key;
          best_e = e;
          value = v;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        const float ov = __shfl_xor_sync(0xffffffffu, value, o);
        if (ob > best || (ob == best && oe < best_e)) {
          best = ob;
          best_e = oe;
          value = ov;
        }
      }
      if (lane == 0) {
        const int64_t at = static_cast<int64_t>(t) * top_k + j;
        topk_weights[at] = value;
        topk_ids[at] = best_e;
        token_expert_indices[at] = j * tokens + t;
        s[best_e] = -2.f;
      }
      __syncwarp();
    }
  }
}

// sorted_token_ids [sorted_len] <- pair ids grouped by expert, padded per expert to a multiple
// of block_size with `pairs`; experts_ids [ids_len] <- each block's expert, -1 past the end;
// num_post_pad[0] <- the padded length. Pairs whose id is outside [0, E) are left out.
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_block_size_kernel(const int* __restrict__ topk_ids, int pairs, int experts, int block_size,
                                int* __restrict__ sorted_token_ids, int sorted_len, int* __restrict__ experts_ids,
                                int ids_len, int* __restrict__ num_post_pad) {
  __shared__ int counts[kTopkMaxExperts];
  __shared__ int offsets[kTopkMaxExperts + 1];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  for (int i = threadIdx.x; i < sorted_len; i += blockDim.x) sorted_token_ids[i] = pairs;
  for (int i = threadIdx.x; i < ids_len; i += blockDim.x) experts_ids[i] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int e = topk_ids[i];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // at most 1024 experts: a serial scan costs less than a sync-heavy one
    int run = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      run += (counts[e] + block_size - 1) / block_size * block_size;
    }
    offsets[experts] = run;
    num_post_pad[0] = run;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    for (int b = offsets[e] / block_size; b < offsets[e + 1] / block_size; ++b) experts_ids[b] = e;
    counts[e] = 0;  // from here: the expert's fill cursor
  }
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int e = topk_ids[i];
    if (e >= 0 && e < experts) sorted_token_ids[offsets[e] + atomicAdd(&counts[e], 1)] = i;
  }
}

// out [tokens, hidden] = sum over j of in [tokens, top_k, hidden]. Grid: x = tokens.
template <typename T>
__global__ void moe_sum_kernel(T* __restrict__ out, const T* __restrict__ in, int top_k, int hidden) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int64_t t = blockIdx.x;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < top_k; ++j) acc += Convert<T>::to_float(in[(t * top_k + j) * hidden + h]);
      out[t * hidden + h] = Convert<T>::from_float(acc);
    }
  }
}

}  // namespace vllm_volta
