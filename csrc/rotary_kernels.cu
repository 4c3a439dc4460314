// Host launcher for the in-place rotary embedding (device code: kernels/rotary.cuh).
// No host sync and a grid that depends only on the shapes, so it can be captured in a CUDA graph.
#include "cuda_launch.h"
#include "kernels/rotary.cuh"
#include "ops.h"
#include "attention_checks.h"
#include "rotary_checks.h"

#include <algorithm>

namespace vllm_volta {

namespace {

struct CacheTarget {  // rotary_embedding_and_cache's extra arguments
  const Tensor* value;
  const Tensor* kv_cache;
  const Tensor* slot_mapping;
  CacheWriteArgs args;
};

void launch_rotary(const char* op, const RotaryArgs& a, Tensor positions, Tensor query, std::optional<Tensor> key,
                   int64_t head_size, Tensor cos_sin_cache, bool is_neox, const CacheTarget* cache) {
  check_cuda(op, "query", query);
  const int64_t num_heads = a.query.num_heads + a.key.num_heads;
  if (a.num_tokens == 0 || (num_heads == 0 && cache == nullptr)) return;
  torch::stable::accelerator::DeviceGuard guard(query.get_device_index());
  const cudaStream_t stream = current_stream(query);
  const int64_t half = a.rot_dim / 2;
  const RotaryParams params{a.query.token_stride,
                            a.key.token_stride,
                            cos_sin_cache.stride(0),
                            a.max_position,
                            static_cast<int>(a.query.num_heads),
                            static_cast<int>(a.key.num_heads),
                            static_cast<int>(head_size),
                            static_cast<int>(a.rot_dim),
                            positions.scalar_type() == ScalarType::Long,
                            cos_sin_cache.scalar_type() == ScalarType::Float};
  void* key_ptr = a.key.num_heads > 0 ? key->data_ptr() : nullptr;

  dispatch_float_type(op, query, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    RotaryCacheWrite<T> write{};
    // Vector width: every row, head and rotated block must start aligned to it. NEOX
    // vectors cover consecutive pairs of one half; GPT-J vectors cover interleaved pairs.
    // The cache write moves whole key/value rows with the same vectors.
    const int64_t block = is_neox ? half : a.rot_dim;
    int width = pick_vec_width(sizeof(T), {query.data_ptr(), key_ptr},
                               {head_size, block, a.query.token_stride, a.key.token_stride});
    if (cache != nullptr) {
      const CacheWriteArgs& c = cache->args;
      const int64_t num_slots = c.cache.num_blocks * c.cache.block_size;
      write = {static_cast<const T*>(cache->value->data_ptr()), c.value_stride,
               static_cast<T*>(cache->kv_cache->data_ptr()),
               static_cast<const int64_t*>(cache->slot_mapping->data_ptr()), num_slots,
               static_cast<int>(c.cache.num_kv_heads * c.cache.head_size)};
      width = std::min(width, pick_vec_width(sizeof(T), {cache->value->data_ptr(), cache->kv_cache->data_ptr()},
                                             {write.row_elems, c.value_stride}));
    }
    dispatch_vec_width<T>(width, [&](auto vec_tag) {
      constexpr int W = decltype(vec_tag)::value;
      const int64_t pairs = is_neox ? RotaryItem<W, true>::kPairs : RotaryItem<W, false>::kPairs;
      const int64_t items = std::max(num_heads * (half / pairs), cache != nullptr ? int64_t{write.row_elems / W} : 0);
      const int threads = round_up(static_cast<int>(std::min<int64_t>(items, 256)), 32);
      const size_t smem = static_cast<size_t>(a.rot_dim) * sizeof(float);
      auto kernel = cache != nullptr ? (is_neox ? &rotary_embedding_kernel<T, W, true, true>
                                                : &rotary_embedding_kernel<T, W, false, true>)
                                     : (is_neox ? &rotary_embedding_kernel<T, W, true, false>
                                                : &rotary_embedding_kernel<T, W, false, false>);
      kernel<<<static_cast<unsigned>(a.num_tokens), threads, smem, stream>>>(
          positions.data_ptr(), static_cast<T*>(query.data_ptr()), static_cast<T*>(key_ptr),
          cos_sin_cache.data_ptr(), params, write);
    });
  });
  check_launch(op);
}

}  // namespace

void rotary_embedding(Tensor positions, Tensor query, std::optional<Tensor> key, int64_t head_size,
                      Tensor cos_sin_cache, bool is_neox) {
  const RotaryArgs a = check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache);
  launch_rotary("rotary_embedding", a, positions, query, key, head_size, cos_sin_cache, is_neox, nullptr);
}

void rotary_embedding_and_cache(Tensor positions, Tensor query, Tensor key, Tensor value, Tensor kv_cache,
                                Tensor slot_mapping, int64_t head_size, Tensor cos_sin_cache, bool is_neox) {
  const char* op = "rotary_embedding_and_cache";
  const RotaryCacheArgs a =
      check_rotary_embedding_and_cache_args(positions, query, key, value, kv_cache, slot_mapping, head_size,
                                            cos_sin_cache);
  const CacheTarget cache{&value, &kv_cache, &slot_mapping, a.cache};
  launch_rotary(op, a.rotary, positions, query, key, head_size, cos_sin_cache, is_neox, &cache);
}

}  // namespace vllm_volta
