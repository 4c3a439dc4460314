// Host launcher for paged-attention decode (device code: kernels/paged_attention.cuh).
// Launch parameters (partition_size, num_threads) come from the caller, which looks them
// up in the tuned kernel configs (vllm_volta/kernel_configs.py).
#include "attention_checks.h"
#include "cuda_launch.h"
#include "kernels/paged_attention_tc.cuh"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace vllm_volta {

namespace {

// Calls f(IntTag<D>{}) for the supported head sizes (checked before).
template <typename F>
void dispatch_head_size(int64_t d, F&& f) {
  switch (d) {
    case 64: return f(IntTag<64>{});
    case 96: return f(IntTag<96>{});
    case 128: return f(IntTag<128>{});
    default: return f(IntTag<256>{});
  }
}

// Query heads per block: the GQA group (query heads sharing one KV head) when it is <= 8,
// else the largest divisor of it that is <= 8 (no KV head is split unevenly).
int64_t heads_per_block(int64_t group) {
  for (int64_t chunks = (group + 7) / 8;; ++chunks)
    if (group % chunks == 0) return group / chunks;
}

// Calls f(IntTag<HPB>{}, BoolTag<EXACT>{}) with the kernel's register bound HPB >= hpb (1, 2,
// 4 or 8); EXACT when hpb == HPB (then the kernel's head count is a compile-time constant).
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};
template <typename F>
void dispatch_heads_bound(int64_t hpb, F&& f) {
  switch (hpb) {
    case 1: return f(IntTag<1>{}, BoolTag<true>{});
    case 2: return f(IntTag<2>{}, BoolTag<true>{});
    case 3: return f(IntTag<4>{}, BoolTag<false>{});
    case 4: return f(IntTag<4>{}, BoolTag<true>{});
    case 8: return f(IntTag<8>{}, BoolTag<true>{});
    default: return f(IntTag<8>{}, BoolTag<false>{});  // 5, 6, 7
  }
}

// What a device allows paged_attention_decode_tc_kernel<D>, asked once per device (not per
// launch): the threads a block can have with the kernel's register count (512 may not fit),
// the shared memory a block may opt in to, and how much the kernel has opted in to so far.
struct TcDeviceLimits {
  int max_threads = 0;  // 0 = not asked yet; -1 = the kernel cannot run here
  int max_smem = 0;
  int64_t smem_opted_in = 48 * 1024;  // the default limit needs no opt-in
};

// FP16 runs on tensor cores when the partition is whole 32-token tiles and the block's
// threads and shared memory fit the device; otherwise (and for FP32 / BF16) on the CUDA-core kernel.
// Returns false when it did not launch.
template <int D>
bool launch_tc(const PagedDecodeParams& params, dim3 grid, unsigned threads, cudaStream_t stream, int device,
               __half* out, float* part_out, float* part_max, float* part_sum, const Tensor& query,
               const Tensor& kv_cache, const Tensor& block_table, const Tensor& seq_lens) {
  auto kernel = paged_attention_decode_tc_kernel<D>;
  static TcDeviceLimits per_device[64];
  TcDeviceLimits& limits = per_device[device % 64];
  if (limits.max_threads == 0) {
    cudaFuncAttributes attr{};
    limits.max_threads = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.maxThreadsPerBlock : -1;
    cudaDeviceGetAttribute(&limits.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (params.partition_size % kTcTile != 0 || static_cast<int>(threads) > limits.max_threads) return false;
  const int64_t smem = tc_smem_bytes(D, static_cast<int>(threads / 32), params.partition_size);
  if (smem > limits.max_smem) return false;
  if (smem > limits.smem_opted_in) {  // above the default limit a kernel must opt in, per device
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    limits.smem_opted_in = smem;
  }
  kernel<<<grid, threads, static_cast<size_t>(smem), stream>>>(
      out, part_out, part_max, part_sum, static_cast<const __half*>(query.data_ptr()),
      static_cast<const __half*>(kv_cache.data_ptr()), static_cast<const int*>(block_table.data_ptr()),
      static_cast<const int*>(seq_lens.data_ptr()), params);
  return true;
}

}  // namespace

void paged_attention_decode(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                            double scale, int64_t max_seq_len, int64_t partition_size, int64_t num_threads) {
  const char* op = "paged_attention_decode";
  const PagedDecodeArgs a = check_paged_decode_args(out, query, kv_cache, block_table, seq_lens, scale, max_seq_len,
                                                    partition_size, num_threads);
  check_cuda(op, "query", query);
  if (a.num_seqs == 0) return;
  // The kernel reads query/key/value rows with 16-byte loads.
  const int64_t q_stride = a.num_seqs > 1 ? query.stride(0) : a.num_heads * a.cache.head_size;
  auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  VLLM_VOLTA_CHECK(aligned16(query.data_ptr()) && aligned16(kv_cache.data_ptr()) && aligned16(out.data_ptr()) &&
                      q_stride * static_cast<int64_t>(query.element_size()) % 16 == 0,
                  op, ": 'query' (data pointer and sequence stride), 'kv_cache' and 'out' must be 16-byte aligned");
  torch::stable::accelerator::DeviceGuard guard(query.get_device_index());
  const cudaStream_t stream = current_stream(query);
  const int64_t d = a.cache.head_size;

  // fp32 scratch for split contexts: [seqs, heads, partitions] x (D outputs + max + sum).
  float* part_out = nullptr;
  float* part_max = nullptr;
  float* part_sum = nullptr;
  Tensor scratch;
  if (a.num_partitions > 1) {
    const int64_t rows = a.num_seqs * a.num_heads * a.num_partitions;
    const std::vector<int64_t> size{rows * (d + 2)};
    scratch = torch::stable::new_empty(query, size, ScalarType::Float);
    part_out = static_cast<float*>(scratch.data_ptr());
    part_max = part_out + rows * d;
    part_sum = part_max + rows;
  }
  const int64_t hpb = heads_per_block(a.num_heads / a.cache.num_kv_heads);
  const PagedDecodeParams params{static_cast<int>(a.num_heads), static_cast<int>(a.cache.num_kv_heads),
                                 static_cast<int>(hpb), static_cast<int>(a.cache.block_size),
                                 static_cast<int>(partition_size),
                                 static_cast<int>(a.num_partitions), q_stride,
                                 block_table.stride(0), a.cache.num_blocks * a.cache.block_size,
                                 static_cast<float>(scale)};

  dispatch_float_type(op, query, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    T* out_ptr = static_cast<T*>(out.data_ptr());
    dispatch_head_size(d, [&](auto d_tag) {
      constexpr int D = decltype(d_tag)::value;
      const dim3 grid(static_cast<unsigned>(a.num_heads / hpb), static_cast<unsigned>(a.num_seqs),
                      static_cast<unsigned>(a.num_partitions));
      const unsigned threads = static_cast<unsigned>(num_threads);
      if constexpr (std::is_same_v<T, __half>) {
        if (launch_tc<D>(params, grid, threads, stream, query.get_device_index(), out_ptr, part_out, part_max,
                         part_sum, query, kv_cache, block_table, seq_lens))
          return;
      }
      dispatch_heads_bound(hpb, [&](auto hpb_tag, auto exact_tag) {
        constexpr int HPB = decltype(hpb_tag)::value;
        constexpr bool EXACT = decltype(exact_tag)::value;
        const size_t smem = sizeof(float) * HPB * std::max<int64_t>(partition_size, D);
        paged_attention_decode_kernel<T, D, HPB, EXACT><<<grid, threads, smem, stream>>>(
            out_ptr, part_out, part_max, part_sum, static_cast<const T*>(query.data_ptr()),
            static_cast<const T*>(kv_cache.data_ptr()), static_cast<const int*>(block_table.data_ptr()),
            static_cast<const int*>(seq_lens.data_ptr()), params);
      });
    });
    if (a.num_partitions > 1) {
      const dim3 grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.num_seqs));
      paged_attention_reduce_kernel<T><<<grid, 128, 0, stream>>>(
          out_ptr, part_out, part_max, part_sum, static_cast<const int*>(seq_lens.data_ptr()), static_cast<int>(d),
          static_cast<int>(partition_size), static_cast<int>(a.num_partitions));
    }
  });
  check_launch(op);
}

}  // namespace vllm_volta
