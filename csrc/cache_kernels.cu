// Host launcher for the KV-cache write (device code: kernels/cache.cuh).
#include "attention_checks.h"
#include "cuda_launch.h"
#include "kernels/cache.cuh"
#include "ops.h"

#include <algorithm>

namespace vllm_volta {

void reshape_and_cache(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping, double k_scale,
                       double v_scale) {
  const char* op = "reshape_and_cache";
  const CacheWriteArgs a = check_reshape_and_cache_args(key, value, kv_cache, slot_mapping, op, /*allow_fp8=*/true);
  check_kv_scales(op, k_scale, v_scale);
  check_cuda(op, "kv_cache", kv_cache);
  const int64_t row = a.cache.num_kv_heads * a.cache.head_size;
  if (a.num_tokens == 0 || row == 0) return;
  torch::stable::accelerator::DeviceGuard guard(kv_cache.get_device_index());
  const cudaStream_t stream = current_stream(kv_cache);
  if (is_fp8_cache(kv_cache)) {
    // Quantized write: the element type comes from key / value, the format from the cache.
    dispatch_float_type(op, key, [&](auto type_tag) {
      using T = typename decltype(type_tag)::type;
      // VEC elements of T in, VEC bytes out: the cache rows must be VEC-byte aligned too.
      const int width = pick_vec_width(sizeof(T), {key.data_ptr(), value.data_ptr()}, {row, a.key_stride, a.value_stride});
      const int cache_width = pick_vec_width(1, {kv_cache.data_ptr()}, {row});
      dispatch_vec_width<T>(std::min(width, cache_width), [&](auto vec_tag) {
        constexpr int VEC = decltype(vec_tag)::value;
        const int threads = std::min<int64_t>(256, round_up(static_cast<int>(std::min<int64_t>(row / VEC, 256)), 32));
        auto launch = [&](auto kernel) {
          kernel<<<static_cast<unsigned>(a.num_tokens), threads, 0, stream>>>(
              static_cast<const T*>(key.data_ptr()), a.key_stride, static_cast<const T*>(value.data_ptr()),
              a.value_stride, static_cast<unsigned char*>(kv_cache.data_ptr()),
              static_cast<const int64_t*>(slot_mapping.data_ptr()), a.cache.num_blocks * a.cache.block_size,
              static_cast<int>(row), static_cast<float>(k_scale), static_cast<float>(v_scale));
        };
        if (kv_cache.scalar_type() == ScalarType::Float8_e4m3fn) launch(reshape_and_cache_fp8_kernel<T, Fp8E4M3, VEC>);
        else launch(reshape_and_cache_fp8_kernel<T, Fp8E5M2, VEC>);
      });
    });
    check_launch(op);
    return;
  }
  dispatch_float_type(op, kv_cache, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    const int width = pick_vec_width(sizeof(T), {key.data_ptr(), value.data_ptr(), kv_cache.data_ptr()},
                                     {row, a.key_stride, a.value_stride});
    dispatch_vec_width<T>(width, [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const int threads = std::min<int64_t>(256, round_up(static_cast<int>(std::min<int64_t>(row / VEC, 256)), 32));
      reshape_and_cache_kernel<T, VEC><<<static_cast<unsigned>(a.num_tokens), threads, 0, stream>>>(
          static_cast<const T*>(key.data_ptr()), a.key_stride, static_cast<const T*>(value.data_ptr()),
          a.value_stride, static_cast<T*>(kv_cache.data_ptr()), static_cast<const int64_t*>(slot_mapping.data_ptr()),
          a.cache.num_blocks * a.cache.block_size, static_cast<int>(row));
    });
  });
  check_launch(op);
}

}  // namespace vllm_volta
