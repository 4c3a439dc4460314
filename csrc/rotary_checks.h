// Argument validation of rotary_embedding, shared by the CUDA launcher and the Meta kernel
// (errors name the op and the argument). Positions are NOT range-checked here: that would
// need a device sync; the kernel leaves tokens whose position is outside
// [0, max_position) unchanged instead of reading past the table.
#pragma once

#include "attention_checks.h"
#include "op_checks.h"

#include <limits>
#include <optional>

namespace vllm_volta {

// Largest rotary dim the kernel stages in shared memory (rot_dim floats, 48 KiB).
constexpr int64_t kMaxRotaryDim = 12288;

struct RotaryHeads {
  int64_t num_heads;
  int64_t token_stride;  // elements between consecutive tokens' rows
};

struct RotaryArgs {
  int64_t num_tokens;
  int64_t rot_dim;
  int64_t max_position;
  RotaryHeads query;
  RotaryHeads key;  // num_heads == 0 when there is no key
};

// query/key: [num_tokens, heads * head_size] or [num_tokens, heads, head_size]; the heads of
// one token are packed (contiguous), tokens may be any stride apart (column views of qkv).
inline RotaryHeads check_rotary_rows(const char* op, const char* arg, const Tensor& t, int64_t head_size,
                                     int64_t num_tokens) {
  VLLM_VOLTA_CHECK(t.dim() == 2 || t.dim() == 3, op, ": '", arg,
                  "' must be [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size], got ",
                  t.dim(), " dimension(s)");
  VLLM_VOLTA_CHECK(t.size(0) == num_tokens, op, ": '", arg, "' has ", t.size(0), " tokens but 'positions' has ",
                  num_tokens);
  int64_t num_heads = 0;
  if (t.dim() == 3) {
    VLLM_VOLTA_CHECK(t.size(2) == head_size, op, ": last dim of '", arg, "' (", t.size(2),
                    ") must equal head_size (", head_size, ")");
    VLLM_VOLTA_CHECK((t.size(2) <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == head_size), op,
                    ": '", arg, "' must be contiguous within each token (heads packed)");
    num_heads = t.size(1);
  } else {
    VLLM_VOLTA_CHECK(t.size(1) % head_size == 0, op, ": last dim of '", arg, "' (", t.size(1),
                    ") must be a multiple of head_size (", head_size, ")");
    VLLM_VOLTA_CHECK(t.size(1) <= 1 || t.stride(1) == 1, op, ": '", arg,
                    "' must be contiguous within each token (last dim stride ", t.stride(1), ")");
    num_heads = t.size(1) / head_size;
  }
  const int64_t row = num_heads * head_size;
  VLLM_VOLTA_CHECK(row <= std::numeric_limits<int>::max(), op, ": '", arg,
                  "' rows are too large (num_heads * head_size must fit in int32)");
  return {num_heads, t.size(0) > 1 ? t.stride(0) : row};
}

inline RotaryArgs check_rotary_embedding_args(const Tensor& positions, const Tensor& query,
                                              const std::optional<Tensor>& key, int64_t head_size,
                                              const Tensor& cos_sin_cache, const char* op = "rotary_embedding") {
  check_float_dtype(op, "query", query);
  VLLM_VOLTA_CHECK(head_size > 0, op, ": 'head_size' must be > 0, got ", head_size);

  VLLM_VOLTA_CHECK(positions.scalar_type() == ScalarType::Long || positions.scalar_type() == ScalarType::Int, op,
                  ": 'positions' must be int64 or int32");
  check_same_device(op, "positions", positions, query, "query");
  const int64_t num_tokens = positions.numel();
  VLLM_VOLTA_CHECK(positions.is_contiguous(), op, ": 'positions' must be contiguous");
  VLLM_VOLTA_CHECK(num_tokens <= std::numeric_limits<int>::max(), op,
                  ": 'positions' has too many tokens (at most 2^31 - 1)");

  const ScalarType cache_dtype = cos_sin_cache.scalar_type();
  VLLM_VOLTA_CHECK(cache_dtype == ScalarType::Float || cache_dtype == query.scalar_type(), op,
                  ": 'cos_sin_cache' must be float32 or the dtype of 'query' (", dtype_name(query.scalar_type()),
                  "), got ", dtype_name(cache_dtype));
  check_same_device(op, "cos_sin_cache", cos_sin_cache, query, "query");
  VLLM_VOLTA_CHECK(cos_sin_cache.dim() == 2, op, ": 'cos_sin_cache' must be [max_position, rot_dim], got ",
                  cos_sin_cache.dim(), " dimension(s)");
  const int64_t rot_dim = cos_sin_cache.size(1);
  VLLM_VOLTA_CHECK(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_size, op,
                  ": rot_dim (last dim of 'cos_sin_cache', ", rot_dim, ") must be even and in [2, head_size=",
                  head_size, "]");
  VLLM_VOLTA_CHECK(rot_dim <= kMaxRotaryDim, op, ": rot_dim (last dim of 'cos_sin_cache', ", rot_dim,
                  ") must be <= ", kMaxRotaryDim);
  VLLM_VOLTA_CHECK(cos_sin_cache.stride(1) == 1, op, ": 'cos_sin_cache' must be contiguous in its last dimension");

  const RotaryHeads q = check_rotary_rows(op, "query", query, head_size, num_tokens);
  RotaryHeads k{0, 0};
  if (key.has_value() && key->defined()) {
    check_same_dtype(op, "key", *key, query, "query");
    check_same_device(op, "key", *key, query, "query");
    k = check_rotary_rows(op, "key", *key, head_size, num_tokens);
  }
  return {num_tokens, rot_dim, cos_sin_cache.size(0), q, k};
}

struct RotaryCacheArgs {
  RotaryArgs rotary;
  CacheWriteArgs cache;
};

// rotary_embedding_and_cache: rotary_embedding's arguments (a key is required) and
// reshape_and_cache's, for the same tokens, in the cache's dtype.
inline RotaryCacheArgs check_rotary_embedding_and_cache_args(const Tensor& positions, const Tensor& query,
                                                             const Tensor& key, const Tensor& value,
                                                             const Tensor& kv_cache, const Tensor& slot_mapping,
                                                             int64_t head_size, const Tensor& cos_sin_cache) {
  const char* op = "rotary_embedding_and_cache";
  const RotaryArgs rotary = check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache, op);
  const CacheWriteArgs cache = check_reshape_and_cache_args(key, value, kv_cache, slot_mapping, op);
  VLLM_VOLTA_CHECK(cache.num_tokens == rotary.num_tokens, op, ": 'slot_mapping' has ", cache.num_tokens,
                  " tokens but 'positions' has ", rotary.num_tokens);
  VLLM_VOLTA_CHECK(cache.cache.head_size == head_size, op, ": the cache's head size (", cache.cache.head_size,
                  ") must equal head_size (", head_size, ")");
  return {rotary, cache};
}

}  // namespace vllm_volta
