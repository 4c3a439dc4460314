// Argument validation of the KV-cache write and paged-attention decode ops, shared by the
// CUDA launchers and the Meta kernels (errors name the op and the argument).
#pragma once

#include "op_checks.h"

namespace vllm_volta {

// Head sizes the paged decode kernel is instantiated for (csrc/attention_kernels.cu).
inline bool paged_attention_supports_head_size(int64_t d) { return d == 64 || d == 96 || d == 128 || d == 256 || d == 512; }

// The longest partition_size the decode op takes (the CUDA-core kernel keeps a partition's
// scores in shared memory without opting in to more than 48 KiB).
constexpr int64_t kMaxPartitionSize = 1024;

// With a sliding window the decode kernels start a sequence's partitions at the window's first
// token rounded down to this many tokens (kWindowAlign in kernels/paged_attention.cuh).
constexpr int64_t kDecodeWindowAlign = 32;

struct KVCacheLayout {
  int64_t num_blocks;
  int64_t block_size;
  int64_t num_kv_heads;
  int64_t head_size;
};

// An FP8 KV cache (x / scale per layer: --kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2).
inline bool is_fp8_cache(const Tensor& kv_cache) {
  const ScalarType s = kv_cache.scalar_type();
  return s == ScalarType::Float8_e4m3fn || s == ScalarType::Float8_e5m2;
}

// allow_fp8: the op reads / writes FP8 caches too (with queries / keys of a float dtype).
inline KVCacheLayout check_kv_cache(const char* op, const Tensor& kv_cache, bool allow_fp8 = false) {
  const ScalarType s = kv_cache.scalar_type();
  const bool ok = s == ScalarType::Float || s == ScalarType::Half || s == ScalarType::BFloat16 ||
                  (allow_fp8 && is_fp8_cache(kv_cache));
  VLLM_VOLTA_CHECK(ok, op, ": 'kv_cache' must be float32, float16, bfloat16",
                  allow_fp8 ? ", float8_e4m3fn or float8_e5m2" : "", ", got ",
                  is_fp8_cache(kv_cache) ? "an FP8 dtype (this op does not take FP8 caches)" : dtype_name(s));
  VLLM_VOLTA_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2, op,
                  ": 'kv_cache' must be [2, num_blocks, block_size, num_kv_heads, head_size]");
  check_contiguous(op, "kv_cache", kv_cache);
  return {kv_cache.size(1), kv_cache.size(2), kv_cache.size(3), kv_cache.size(4)};
}

inline void check_index_tensor(const char* op, const char* arg, const Tensor& t, ScalarType dtype,
                               const char* dtype_str, int64_t dim, const Tensor& ref) {
  VLLM_VOLTA_CHECK(t.scalar_type() == dtype, op, ": '", arg, "' must be ", dtype_str);
  VLLM_VOLTA_CHECK(t.dim() == dim, op, ": '", arg, "' must have ", dim, " dimension(s), got ", t.dim());
  VLLM_VOLTA_CHECK(t.stride(-1) == 1 || t.size(-1) <= 1, op, ": '", arg, "' must be contiguous in its last dimension");
  check_same_device(op, arg, t, ref, "kv_cache");
}

// key/value: [T, KH, D] or [T, KH * D], contiguous within a token, any token stride.
// Returns the token stride (elements).
// With an FP8 cache, key / value are float32, float16 or bfloat16 (quantized on the write).
inline int64_t check_token_rows(const char* op, const char* arg, const Tensor& t, const Tensor& kv_cache,
                                const KVCacheLayout& cache, int64_t num_tokens) {
  if (is_fp8_cache(kv_cache)) check_float_dtype(op, arg, t);
  else check_same_dtype(op, arg, t, kv_cache, "kv_cache");
  check_same_device(op, arg, t, kv_cache, "kv_cache");
  const int64_t row = cache.num_kv_heads * cache.head_size;
  const bool shape_ok = (t.dim() == 3 && t.size(1) == cache.num_kv_heads && t.size(2) == cache.head_size) ||
                        (t.dim() == 2 && t.size(1) == row);
  VLLM_VOLTA_CHECK(shape_ok, op, ": '", arg, "' must be [num_tokens, ", cache.num_kv_heads, ", ", cache.head_size,
                  "] or [num_tokens, ", row, "] to match 'kv_cache'");
  VLLM_VOLTA_CHECK(t.size(0) >= num_tokens, op, ": '", arg, "' has ", t.size(0),
                  " tokens but 'slot_mapping' has ", num_tokens);
  const bool inner_contiguous = t.dim() == 3 ? (t.stride(2) == 1 && t.stride(1) == cache.head_size) : t.stride(1) == 1;
  VLLM_VOLTA_CHECK(inner_contiguous, op, ": '", arg, "' must be contiguous within each token");
  return t.size(0) > 1 ? t.stride(0) : row;
}

struct CacheWriteArgs {
  KVCacheLayout cache;
  int64_t num_tokens;
  int64_t key_stride;
  int64_t value_stride;
};

// The cache's per-layer FP8 scales (1.0 for other caches, where they are not used).
inline void check_kv_scales(const char* op, double k_scale, double v_scale) {
  VLLM_VOLTA_CHECK(k_scale > 0.0 && k_scale < 1e30, op, ": 'k_scale' must be a finite value > 0, got ", k_scale);
  VLLM_VOLTA_CHECK(v_scale > 0.0 && v_scale < 1e30, op, ": 'v_scale' must be a finite value > 0, got ", v_scale);
}

// allow_fp8: reshape_and_cache quantizes into FP8 caches; the fused rotary write does not.
inline CacheWriteArgs check_reshape_and_cache_args(const Tensor& key, const Tensor& value, const Tensor& kv_cache,
                                                   const Tensor& slot_mapping, const char* op = "reshape_and_cache",
                                                   bool allow_fp8 = false) {
  const KVCacheLayout cache = check_kv_cache(op, kv_cache, allow_fp8);
  check_index_tensor(op, "slot_mapping", slot_mapping, ScalarType::Long, "int64", 1, kv_cache);
  const int64_t num_tokens = slot_mapping.size(0);
  const int64_t key_stride = check_token_rows(op, "key", key, kv_cache, cache, num_tokens);
  const int64_t value_stride = check_token_rows(op, "value", value, kv_cache, cache, num_tokens);
  check_same_dtype(op, "value", value, key, "key");
  return {cache, num_tokens, key_stride, value_stride};
}

struct PagedDecodeArgs {
  KVCacheLayout cache;
  int64_t num_seqs;
  int64_t num_heads;
  int64_t num_partitions;
  int64_t max_span;  // the longest context the grid covers: max_seq_len, or less with a window
};

inline PagedDecodeArgs check_paged_decode_args(const Tensor& out, const Tensor& query, const Tensor& kv_cache,
                                               const Tensor& block_table, const Tensor& seq_lens, double scale,
                                               int64_t max_seq_len, int64_t partition_size, int64_t num_threads,
                                               int64_t sliding_window, double soft_cap, double k_scale = 1.0,
                                               double v_scale = 1.0) {
  const char* op = "paged_attention_decode";
  const KVCacheLayout cache = check_kv_cache(op, kv_cache, /*allow_fp8=*/true);
  if (is_fp8_cache(kv_cache)) check_float_dtype(op, "query", query);
  else check_same_dtype(op, "query", query, kv_cache, "kv_cache");
  check_kv_scales(op, k_scale, v_scale);
  check_same_device(op, "query", query, kv_cache, "kv_cache");
  VLLM_VOLTA_CHECK(query.dim() == 3 && query.size(2) == cache.head_size, op,
                  ": 'query' must be [num_seqs, num_heads, ", cache.head_size, "]");
  VLLM_VOLTA_CHECK(query.stride(2) == 1 && query.stride(1) == cache.head_size, op,
                  ": 'query' must be contiguous within each sequence (heads packed)");
  const int64_t num_seqs = query.size(0), num_heads = query.size(1);
  VLLM_VOLTA_CHECK(num_heads > 0 && num_heads % cache.num_kv_heads == 0, op, ": num_heads (", num_heads,
                  ") must be a positive multiple of the cache's num_kv_heads (", cache.num_kv_heads, ")");
  VLLM_VOLTA_CHECK(paged_attention_supports_head_size(cache.head_size), op, ": head_size ", cache.head_size,
                  " is not supported (supported: 64, 96, 128, 256, 512)");
  check_same_dtype(op, "out", out, query, "query");
  check_same_device(op, "out", out, query, "query");
  check_same_shape(op, "out", out, query, "query");
  check_contiguous(op, "out", out);
  check_index_tensor(op, "block_table", block_table, ScalarType::Int, "int32", 2, kv_cache);
  VLLM_VOLTA_CHECK(block_table.size(0) == num_seqs, op, ": 'block_table' must have one row per sequence (",
                  num_seqs, "), got ", block_table.size(0));
  check_index_tensor(op, "seq_lens", seq_lens, ScalarType::Int, "int32", 1, kv_cache);
  VLLM_VOLTA_CHECK(seq_lens.size(0) == num_seqs, op, ": 'seq_lens' must have ", num_seqs, " entries, got ",
                  seq_lens.size(0));
  VLLM_VOLTA_CHECK(scale > 0.0, op, ": 'scale' must be > 0, got ", scale);
  VLLM_VOLTA_CHECK(max_seq_len >= 0 && max_seq_len <= block_table.size(1) * cache.block_size, op,
                  ": 'max_seq_len' must be in [0, ", block_table.size(1) * cache.block_size,
                  "] (block_table columns x block_size), got ", max_seq_len);
  VLLM_VOLTA_CHECK(partition_size >= 16 && partition_size <= kMaxPartitionSize && partition_size % 16 == 0, op,
                  ": 'partition_size' must be a multiple of 16 in [16, ", kMaxPartitionSize, "], got ", partition_size);
  VLLM_VOLTA_CHECK(num_threads % 32 == 0 && num_threads >= 64 && num_threads <= 512, op,
                  ": 'num_threads' must be a multiple of 32 in [64, 512], got ", num_threads);
  VLLM_VOLTA_CHECK(sliding_window >= 0 && sliding_window < (1LL << 31), op,
                  ": 'sliding_window' must be >= 0 (0 = none), got ", sliding_window);
  VLLM_VOLTA_CHECK(soft_cap >= 0.0, op, ": 'logits_soft_cap' must be >= 0 (0 = none), got ", soft_cap);
  // A window's partitions start at most kDecodeWindowAlign - 1 tokens before it.
  const int64_t span = sliding_window > 0 ? std::min<int64_t>(max_seq_len, sliding_window + kDecodeWindowAlign - 1)
                                          : max_seq_len;
  const int64_t num_partitions = span <= partition_size ? 1 : (span + partition_size - 1) / partition_size;
  VLLM_VOLTA_CHECK(num_partitions <= 65535, op, ": max_seq_len / partition_size exceeds 65535 partitions");
  return {cache, num_seqs, num_heads, num_partitions, span};
}

}  // namespace vllm_volta
