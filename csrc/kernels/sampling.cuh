// Random sampling as a Gumbel-max in one pass over the logits (device code only), and the
// same pass without noise for greedy rows (argmax):
//   token = argmax_i (logits[i] / T + G_i),  G_i = -log(E_i),  E_i ~ Exp(1),
// which draws token i with probability softmax(logits / T)_i (the sampler's exponential race
// argmax(p_i / E_i) with log taken). No float32 copy, softmax or random tensor is written.
// E_i comes from a counter-based Philox4x32-10 stream: key = the row's 64-bit seed, counter
// = (i / 4, the call's 64-bit seed offset) (4 draws per call), so a row's draws depend only on
// its seed and the offset, not on the launch shape or the other rows.
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kSampleThreads = 256;
constexpr int64_t kSampleBlockSpan = 8192;  // vocabulary entries per block: 32 per thread

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
__device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key) {
  constexpr unsigned kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(kM0, ctr.x), lo0 = kM0 * ctr.x;
    const unsigned hi1 = __umulhi(kM1, ctr.z), lo1 = kM1 * ctr.z;
    ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    key.x += kW0;
    key.y += kW1;
  }
  return ctr;
}

// Gumbel noise -log(E), E = -log(1 - v) ~ Exp(1), v = (bits + 1/2) / 2^32 in (0, 1). Small v
// (large noise: the tail that decides the argmax) takes the series v + v^2/2 (relative error
// < 4e-7), so E keeps its precision there; elsewhere the hardware log (__logf, absolute
// error ~4e-7) is far below the FP16 spacing of the logits it is added to. Accurate logf /
// log1pf made the kernel compute-bound (about 60 instructions per vocabulary entry).
__device__ __forceinline__ float gumbel_noise(unsigned bits) {
  const float v = (static_cast<float>(bits) + 0.5f) * 2.3283064365386963e-10f;
  const float e = v < 1e-3f ? v * (1.f + 0.5f * v) : -__logf(1.f - v);
  return -__logf(e);
}

// (key, index) as one unsigned 64-bit value whose unsigned order is the key's float order,
// ties going to the lower index; 0 never occurs (it means "no candidate").
__device__ __forceinline__ unsigned long long pack_candidate(float key, int index) {
  const unsigned bits = __float_as_uint(key);
  const unsigned ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | (0xFFFFFFFFu - static_cast<unsigned>(index));
}

// One vocabulary entry: its key (logit / T + Gumbel noise, or the logit) against the thread's
// best so far. Entries come in increasing index order, so a tie keeps the lower index; NaN
// never wins, nor does -inf (a row with no other entry has no candidate: token 0).
template <bool NOISE>
__device__ __forceinline__ void consider(float logit, float inv_t, unsigned bits, int index, float& best_key,
                                         int& best_index) {
  const float k = NOISE ? logit * inv_t + gumbel_noise(bits) : logit;
  if (k > best_key) {
    best_key = k;
    best_index = index;
  }
}

// Grid (rows, ceil(vocab / kSampleBlockSpan)): each block folds its span of one row into
// best[row] with one 64-bit atomicMax, then counts itself in arrived[row]; the row's last block
// to arrive writes the winner's token id to sampled[row] (0 when the row had no candidate) and
// sets best[row] and arrived[row] back to 0. So best[] and arrived[] (the caller's workspace)
// must be zero before a launch and are zero again after it: no clearing or unpacking launch.
// A thread reads its entries as 16-byte vectors (VEC: the row start and stride keep them
// aligned, checked by the host) of N entries, vector v of thread t at entry
// span + (v * kSampleThreads + t) * N, so a warp reads 512 consecutive bytes per load; ragged
// ends and unaligned rows go entry by entry. The noise of entry i is word i % 4 of
// Philox(counter (i / 4, offset)), whatever the path. With sampled_host (pinned host memory,
// device-mapped) the id is written there too, so no device-to-host copy has to follow.
// NOISE false: the plain argmax of the logits (greedy sampling; temperature and seeds are
// not read).
template <typename T, bool NOISE, bool VEC>
__global__ void __launch_bounds__(kSampleThreads)
    gumbel_argmax_kernel(int64_t* __restrict__ sampled, unsigned long long* __restrict__ best,
                         unsigned long long* __restrict__ arrived, const T* __restrict__ logits, int64_t row_stride,
                         int vocab, const float* __restrict__ temperature, const int64_t* __restrict__ seeds,
                         unsigned long long seed_offset, int64_t* __restrict__ sampled_host) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    constexpr int N = 16 / sizeof(T);
    constexpr int kVecs = static_cast<int>(kSampleBlockSpan) / (kSampleThreads * N);
    static_assert(N % 4 == 0 && kVecs * kSampleThreads * N == kSampleBlockSpan, "whole Philox quads per vector");
    const T* x = logits + static_cast<int64_t>(blockIdx.x) * row_stride;
    float inv_t = 1.f;
    uint2 key = make_uint2(0u, 0u);
    if constexpr (NOISE) {
      inv_t = 1.f / temperature[blockIdx.x];
      const unsigned long long seed = static_cast<unsigned long long>(seeds[blockIdx.x]);
      key = make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
    }
    float best_key = -__int_as_float(0x7f800000);  // -inf
    int best_index = -1;
    const int span = static_cast<int>(blockIdx.y) * static_cast<int>(kSampleBlockSpan);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int i0 = span + (v * kSampleThreads + static_cast<int>(threadIdx.x)) * N;
      if (i0 >= vocab) break;  // later vectors of this thread start further on
      unsigned bits[N];
#pragma unroll
      for (int q = 0; q < N / 4; ++q) {
        uint4 r = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (NOISE)
          r = philox4x32_10(make_uint4(static_cast<unsigned>(i0 / 4 + q), static_cast<unsigned>(seed_offset),
                                       static_cast<unsigned>(seed_offset >> 32), 0u),
                            key);
        bits[4 * q] = r.x, bits[4 * q + 1] = r.y, bits[4 * q + 2] = r.z, bits[4 * q + 3] = r.w;
      }
      if (VEC && i0 + N <= vocab) {
        const Vec<T, N> vals = *reinterpret_cast<const Vec<T, N>*>(x + i0);
#pragma unroll
        for (int e = 0; e < N; ++e)
          consider<NOISE>(Convert<T>::to_float(vals.v[e]), inv_t, bits[e], i0 + e, best_key, best_index);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e)
          if (i0 + e < vocab)
            consider<NOISE>(Convert<T>::to_float(x[i0 + e]), inv_t, bits[e], i0 + e, best_key, best_index);
      }
    }
    unsigned long long local = best_index < 0 ? 0ull : pack_candidate(best_key, best_index);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
    __shared__ unsigned long long per_warp[kSampleThreads / 32];
    if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int w = 1; w < kSampleThreads / 32; ++w) local = max(local, per_warp[w]);
      if (local != 0) atomicMax(best + blockIdx.x, local);
      __threadfence();  // this block's atomicMax lands before its arrival is counted
      if (atomicAdd(arrived + blockIdx.x, 1ull) == gridDim.y - 1) {
        // Every block of the row has folded its span in: take the winner, leave zeros behind.
        __threadfence();
        const unsigned long long v = atomicExch(best + blockIdx.x, 0ull);
        arrived[blockIdx.x] = 0;
        const int64_t id = v == 0 ? 0 : static_cast<int64_t>(0xFFFFFFFFu - static_cast<unsigned>(v));
        sampled[blockIdx.x] = id;
        if (sampled_host != nullptr) sampled_host[blockIdx.x] = id;
      }
    }
  }
}

}  // namespace vllm_volta
