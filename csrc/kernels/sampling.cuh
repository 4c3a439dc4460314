// Random sampling as a Gumbel-max in one pass over the logits (device code only), and the
// same pass without noise for greedy rows (argmax):
//   token = argmax_i (logits[i] / T + G_i),  G_i = -log(E_i),  E_i ~ Exp(1),
// which draws token i with probability softmax(logits / T)_i (the sampler's exponential race
// argmax(p_i / E_i) with log taken). No float32 copy, softmax or random tensor is written.
// E_i comes from a counter-based Philox4x32-10 stream: key = the row's 64-bit seed, counter
// = i / 4 (4 draws per call), so a row's draws depend only on its seed, not on the launch
// shape or the other rows.
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kSampleThreads = 256;
constexpr int kSampleQuadsPerThread = 8;  // a block covers 256 x 8 x 4 = 8192 vocabulary entries
constexpr int64_t kSampleBlockSpan = int64_t{kSampleThreads} * kSampleQuadsPerThread * 4;

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
__device__ __forceinline__ unsigned long long pack_candidate(float key, int64_t index) {
  const unsigned bits = __float_as_uint(key);
  const unsigned ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | (0xFFFFFFFFu - static_cast<unsigned>(index));
}

// Grid (rows, ceil(vocab / kSampleBlockSpan)): each block folds its span of one row into
// best[row] with a 64-bit atomicMax (best[] zeroed before). NOISE false: the plain argmax of
// the logits (greedy sampling; temperature and seeds are not read).
template <typename T, bool NOISE>
__global__ void gumbel_argmax_kernel(unsigned long long* __restrict__ best, const T* __restrict__ logits,
                                     int64_t row_stride, int64_t vocab, const float* __restrict__ temperature,
                                     const int64_t* __restrict__ seeds) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int64_t row = blockIdx.x;
    const T* x = logits + row * row_stride;
    float inv_t = 1.f;
    uint2 key = make_uint2(0u, 0u);
    if constexpr (NOISE) {
      inv_t = 1.f / temperature[row];
      const unsigned long long seed = static_cast<unsigned long long>(seeds[row]);
      key = make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
    }
    unsigned long long local = 0;
    const int64_t quad0 = static_cast<int64_t>(blockIdx.y) * kSampleThreads * kSampleQuadsPerThread + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kSampleQuadsPerThread; ++j) {
      const int64_t quad = quad0 + j * kSampleThreads;
      if (quad * 4 >= vocab) continue;
      unsigned bits[4] = {0u, 0u, 0u, 0u};
      if constexpr (NOISE) {
        const uint4 r = philox4x32_10(
            make_uint4(static_cast<unsigned>(quad), static_cast<unsigned>(quad >> 32), 0u, 0u), key);
        bits[0] = r.x, bits[1] = r.y, bits[2] = r.z, bits[3] = r.w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = quad * 4 + e;
        if (i >= vocab) continue;
        const float logit = Convert<T>::to_float(x[i]);
        const float k = NOISE ? logit * inv_t + gumbel_noise(bits[e]) : logit;
        if (k == k) local = max(local, pack_candidate(k, i));  // NaN never wins
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
    if (threadIdx.x % 32 == 0 && local != 0) atomicMax(best + row, local);
  }
}

// In place: the packed winner of each row -> its token id (0 when a row had no candidate).
__global__ void gumbel_unpack_kernel(int64_t* __restrict__ sampled, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const unsigned long long v = static_cast<unsigned long long>(sampled[row]);
  sampled[row] = v == 0 ? 0 : static_cast<int64_t>(0xFFFFFFFFu - static_cast<unsigned>(v));
}

}  // namespace vllm_volta
