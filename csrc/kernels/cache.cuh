// KV-cache write (device code only): copies each new token's key/value rows into the
// paged cache [2, num_blocks, block_size, num_kv_heads, head_size] at its slot
// (block = slot / block_size, offset = slot % block_size). Slots < 0 (padding) and
// slots past the cache are skipped. One block per token, VEC elements per access.
// reshape_and_cache_fp8_kernel writes an FP8 cache: x / scale (k_scale for keys, v_scale for
// values), rounded to nearest even and saturated to the format's largest finite value.
#pragma once

#include "kernels/kv_fp8.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

template <typename T, int VEC>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, int64_t key_stride,
                                         const T* __restrict__ value, int64_t value_stride,
                                         T* __restrict__ kv_cache, const int64_t* __restrict__ slot_mapping,
                                         int64_t num_slots, int row_elems) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    using V = Vec<T, VEC>;
    const int64_t token = blockIdx.x;
    const int64_t slot = slot_mapping[token];
    if (slot < 0 || slot >= num_slots) return;
    // Value half of the cache starts num_slots rows after the key half.
    V* k_dst = reinterpret_cast<V*>(kv_cache + slot * row_elems);
    V* v_dst = reinterpret_cast<V*>(kv_cache + (num_slots + slot) * row_elems);
    const V* k_src = reinterpret_cast<const V*>(key + token * key_stride);
    const V* v_src = reinterpret_cast<const V*>(value + token * value_stride);
    for (int i = threadIdx.x; i < row_elems / VEC; i += blockDim.x) {
      k_dst[i] = k_src[i];
      v_dst[i] = v_src[i];
    }
  }
}

template <typename T, typename Fmt, int VEC>
__global__ void reshape_and_cache_fp8_kernel(const T* __restrict__ key, int64_t key_stride,
                                             const T* __restrict__ value, int64_t value_stride,
                                             unsigned char* __restrict__ kv_cache,
                                             const int64_t* __restrict__ slot_mapping, int64_t num_slots,
                                             int row_elems, float k_scale, float v_scale) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    using V = Vec<T, VEC>;
    using B = Vec<unsigned char, VEC>;
    const int64_t token = blockIdx.x;
    const int64_t slot = slot_mapping[token];
    if (slot < 0 || slot >= num_slots) return;
    B* k_dst = reinterpret_cast<B*>(kv_cache + slot * row_elems);
    B* v_dst = reinterpret_cast<B*>(kv_cache + (num_slots + slot) * row_elems);
    const V* k_src = reinterpret_cast<const V*>(key + token * key_stride);
    const V* v_src = reinterpret_cast<const V*>(value + token * value_stride);
    for (int i = threadIdx.x; i < row_elems / VEC; i += blockDim.x) {
      const V k = k_src[i], v = v_src[i];
      B kq, vq;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        // IEEE division (not a reciprocal multiply): the reference divides in float32.
        kq.v[j] = float_to_fp8<Fmt>(__fdiv_rn(Convert<T>::to_float(k.v[j]), k_scale));
        vq.v[j] = float_to_fp8<Fmt>(__fdiv_rn(Convert<T>::to_float(v.v[j]), v_scale));
      }
      k_dst[i] = kq;
      v_dst[i] = vq;
    }
  }
}

}  // namespace vllm_volta
