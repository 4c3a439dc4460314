// Rotary position embedding, in place (device code only). One block per token: the block
// stages the token's cos/sin row (rounded to T) in shared memory, then its threads walk the
// (head, pair-chunk) items of the query heads followed by the key heads.
//
// CACHE (rotary_embedding_and_cache): the block then also writes the token's rotated key row
// and its value row into the paged KV cache at its slot, as reshape_and_cache does (slots < 0
// or past the cache are skipped): one kernel instead of two per layer.
//
// Numerics are those of the PyTorch reference (RotaryEmbedding.forward_native): cos/sin are
// cast to T first, and every elementwise op is computed in fp32 and rounded to T:
//   o1 = T(T(x1 * c) - T(x2 * s)),  o2 = T(T(x2 * c) + T(x1 * s))
// The __f*_rn intrinsics keep nvcc from contracting these into FMAs (which would change
// fp32 results).
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

struct RotaryParams {
  int64_t query_stride;  // elements between tokens' query rows
  int64_t key_stride;    // elements between tokens' key rows
  int64_t cache_stride;  // elements between cos_sin_cache rows
  int64_t max_position;  // rows of cos_sin_cache
  int num_heads;
  int num_kv_heads;  // 0: no key
  int head_size;
  int rot_dim;
  bool positions_int64;  // else int32
  bool cache_is_float;   // cos_sin_cache is float32, else T
};

// Pairs handled by one work item: NEOX loads P = W elements of each half; GPT-J loads the
// 2P interleaved elements of P pairs as 2P / W vectors of W (W = 1: two scalars, one pair).
template <int W, bool NEOX>
struct RotaryItem {
  static constexpr int kPairs = NEOX ? W : (W > 1 ? W / 2 : 1);
};

template <typename T>
__device__ __forceinline__ void rotate_pair(T& x1, T& x2, float c, float s) {
  const float a = Convert<T>::to_float(x1);
  const float b = Convert<T>::to_float(x2);
  const float o1 = __fsub_rn(round_to<T>(__fmul_rn(a, c)), round_to<T>(__fmul_rn(b, s)));
  const float o2 = __fadd_rn(round_to<T>(__fmul_rn(b, c)), round_to<T>(__fmul_rn(a, s)));
  x1 = Convert<T>::from_float(o1);
  x2 = Convert<T>::from_float(o2);
}

// Rotates pairs [i0, i0 + P) of the head starting at `head`; cs = [cos | sin] of the token.
template <typename T, int W, bool NEOX>
__device__ __forceinline__ void rotate_item(T* __restrict__ head, int i0, int half, const float* cs) {
  constexpr int P = RotaryItem<W, NEOX>::kPairs;
  if constexpr (NEOX) {
    Vec<T, P>* lo = reinterpret_cast<Vec<T, P>*>(head + i0);
    Vec<T, P>* hi = reinterpret_cast<Vec<T, P>*>(head + half + i0);
    Vec<T, P> x1 = *lo;
    Vec<T, P> x2 = *hi;
#pragma unroll
    for (int j = 0; j < P; ++j) rotate_pair(x1.v[j], x2.v[j], cs[i0 + j], cs[half + i0 + j]);
    *lo = x1;
    *hi = x2;
  } else {
    constexpr int kLoads = 2 * P / W;
    Vec<T, W>* src = reinterpret_cast<Vec<T, W>*>(head + 2 * i0);
    Vec<T, 2 * P> x;
#pragma unroll
    for (int k = 0; k < kLoads; ++k) reinterpret_cast<Vec<T, W>*>(x.v)[k] = src[k];
#pragma unroll
    for (int j = 0; j < P; ++j) rotate_pair(x.v[2 * j], x.v[2 * j + 1], cs[i0 + j], cs[half + i0 + j]);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) src[k] = reinterpret_cast<const Vec<T, W>*>(x.v)[k];
  }
}

// The KV-cache write of rotary_embedding_and_cache (see reshape_and_cache_kernel).
template <typename T>
struct RotaryCacheWrite {
  const T* value;
  int64_t value_stride;  // elements between tokens' value rows
  T* kv_cache;           // [2, num_slots, row_elems]
  const int64_t* slot_mapping;
  int64_t num_slots;
  int row_elems;  // num_kv_heads * head_size
};

// Grid: one block per token; dynamic shared memory: rot_dim floats.
// W: vector width in elements (host guarantees alignment of rows, heads and halves, and for
// CACHE of the value rows and the cache rows too).
template <typename T, int W, bool NEOX, bool CACHE>
__global__ void rotary_embedding_kernel(const void* __restrict__ positions, T* __restrict__ query,
                                        T* __restrict__ key, const void* __restrict__ cos_sin_cache,
                                        RotaryParams p, RotaryCacheWrite<T> c) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    extern __shared__ float cs[];  // [rot_dim]: cos then sin, each rounded to T
    const int64_t token = blockIdx.x;
    const int64_t pos = p.positions_int64 ? static_cast<const int64_t*>(positions)[token]
                                          : static_cast<int64_t>(static_cast<const int*>(positions)[token]);
    // Out-of-range positions are not an error the host can see; leave the token unchanged
    // rather than read past the table.
    const bool rotate = pos >= 0 && pos < p.max_position;
    if (rotate) {  // uniform over the block
      const int64_t row = pos * p.cache_stride;
      for (int i = threadIdx.x; i < p.rot_dim; i += blockDim.x) {
        const float v = p.cache_is_float ? static_cast<const float*>(cos_sin_cache)[row + i]
                                         : Convert<T>::to_float(static_cast<const T*>(cos_sin_cache)[row + i]);
        cs[i] = round_to<T>(v);
      }
      __syncthreads();

      const int half = p.rot_dim / 2;
      const int items_per_head = half / RotaryItem<W, NEOX>::kPairs;
      const int items = (p.num_heads + p.num_kv_heads) * items_per_head;
      T* q_row = query + token * p.query_stride;
      T* k_row = key == nullptr ? nullptr : key + token * p.key_stride;
      for (int idx = threadIdx.x; idx < items; idx += blockDim.x) {
        const int head = idx / items_per_head;
        const int i0 = (idx - head * items_per_head) * RotaryItem<W, NEOX>::kPairs;
        T* base = head < p.num_heads ? q_row + head * p.head_size : k_row + (head - p.num_heads) * p.head_size;
        rotate_item<T, W, NEOX>(base, i0, half, cs);
      }
    }
    if constexpr (CACHE) {
      const int64_t slot = c.slot_mapping[token];
      if (slot < 0 || slot >= c.num_slots) return;
      __syncthreads();  // the block's rotated key row is written (and visible to the block)
      using V = Vec<T, W>;
      const V* k_src = reinterpret_cast<const V*>(key + token * p.key_stride);
      const V* v_src = reinterpret_cast<const V*>(c.value + token * c.value_stride);
      V* k_dst = reinterpret_cast<V*>(c.kv_cache + slot * c.row_elems);
      V* v_dst = reinterpret_cast<V*>(c.kv_cache + (c.num_slots + slot) * c.row_elems);
      for (int i = threadIdx.x; i < c.row_elems / W; i += blockDim.x) {
        k_dst[i] = k_src[i];
        v_dst[i] = v_src[i];
      }
    }
  }
}

}  // namespace vllm_volta
