// Host launcher for paged-attention decode (device code: kernels/paged_attention.cuh).
// Launch parameters (partition_size, num_threads) come from the caller, which looks them
// up in the tuned kernel configs (vllm_volta/kernel_configs.py); the FP16 / BF16 tensor-core path
// uses fewer warps per block when the tuned block does not fit the SM, and may split long
// contexts into partitions longer than the op's maximum (plan_tc_launch). An FP8 cache (float8_e4m3fn /
// float8_e5m2, with FP16 / BF16 queries) runs the same kernels on its cache element type, the
// key scale folded into the score scale and the value scale into the output.
#include "attention_checks.h"
#include "cuda_launch.h"
#include "kernels/paged_attention_tc.cuh"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

namespace vllm_volta {

static_assert(kWindowAlign == kDecodeWindowAlign, "host and kernels must align windows alike");

namespace {

// Calls f(IntTag<D>{}) for the supported head sizes (checked before).
template <typename F>
void dispatch_head_size(int64_t d, F&& f) {
  switch (d) {
    case 64: return f(IntTag<64>{});
    case 96: return f(IntTag<96>{});
    case 128: return f(IntTag<128>{});
    case 256: return f(IntTag<256>{});
    default: return f(IntTag<512>{});  // Gemma 4's full-attention layers
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

// What a device allows paged_attention_decode_tc_kernel<T, D>, asked once per device (not per
// launch): the threads a block can have with the kernel's register count (512 may not fit),
// the shared memory a block may use (the kernel opts in to all of it at once) and the SMs;
// then, per (threads, shared memory) asked, how many blocks are resident on an SM.
struct TcDevice {
  int max_threads = 0;  // 0 = not asked yet; -1 = the kernel cannot run here
  int max_smem = 0;  // a block's shared memory limit (opt-in), bytes
  int num_sms = 0;
  std::map<std::pair<int64_t, int64_t>, int> resident;
};

// With VLLM_VOLTA_DEVICE_CAPABILITY below the device's own (Volta mode on a newer GPU), a
// tensor-core block may use no more shared memory than an SM of that capability has (96 KiB on
// SM70, 64 KiB on SM75: the occupancy calculator's figures), as on that GPU: a larger one runs
// with fewer warps, else the CUDA-core kernel runs. Blocks per SM still come from this GPU. The
// limit in bytes, or 0 when unset or not below this device's.
int emulated_block_smem_limit(int device) {
  const int sm = emulated_device_sm();
  if (sm < 10) return 0;  // unset
  const int major = sm / 10, minor = sm % 10;
  int smem = 0;
  if (major == 7) smem = (minor == 5 ? 64 : 96) * 1024;
  if (major == 8) smem = (minor == 0 || minor == 7 ? 164 : 100) * 1024;
  int real = 0;
  cudaDeviceGetAttribute(&real, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  return smem < real ? smem : 0;
}

// A block's fixed cost (queries, block-table reads, the first tile's latency, the epilogue)
// in context tokens, for comparing launches that split the context differently.
constexpr int64_t kTcBlockOverheadTokens = 64;

struct TcLaunch {
  int64_t smem = 0;  // 0: the tensor-core kernel cannot run this launch
  int64_t partition_size = 0;
  int64_t num_partitions = 0;
  int64_t threads = 0;
};

// The tensor-core launch for the tuned (partition_size, threads), which split the context into
// tuned_parts partitions; none when the partition is not whole 32-token tiles or no block fits
// (the CUDA-core kernel runs then).
// - A block whose shared memory does not fit the SM (each warp stages its own tile) gets fewer
//   warps, down to 2.
// - Partitions longer than the op's maximum: when the tuned partition is the maximum and the grid
//   spans more than one wave of resident blocks, the launch may split the context into fewer,
//   longer partitions (down to half as many) when that fills the waves better. A wave takes
//   (blocks per SM) x (partition + fixed block cost), slower in proportion when longer
//   partitions leave fewer warps resident. H200, 8 KV heads x 4096 tokens, tuned 1024 / 192:
//   batch 16-128 3-5% faster than the tuned launch (64: 262.6 vs 271.6 us). Grids are not
//   rebalanced otherwise: giving blocks fewer warps, or lengthening a partition the tuner chose
//   below the maximum, measured slower than the tuned launch (1000 x 640 tokens, 2 KV heads:
//   191.5 vs 174.3 us; 256 x 4096, tuned 512 / 64: 1142 vs 1044 us).
template <typename T, int D, typename C = T>
TcLaunch plan_tc_launch(int device, int64_t blocks_per_partition, int64_t max_seq_len, int64_t partition_size,
                        int64_t tuned_parts, int64_t tuned_threads, int64_t hpb) {
  auto kernel = paged_attention_decode_tc_kernel<T, D, C>;
  static std::mutex mutex;
  static TcDevice per_device[64];
  std::lock_guard<std::mutex> lock(mutex);
  TcDevice& dev = per_device[device % 64];
  if (dev.max_threads == 0) {
    cudaFuncAttributes attr{};
    dev.max_threads = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.maxThreadsPerBlock / 32 * 32 : -1;
    cudaDeviceGetAttribute(&dev.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&dev.num_sms, cudaDevAttrMultiProcessorCount, device);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.max_smem) != cudaSuccess)
      dev.max_smem = 48 * 1024;  // the default limit needs no opt-in
    if (const int emulated = emulated_block_smem_limit(device)) dev.max_smem = std::min(dev.max_smem, emulated);
  }
  if (partition_size % kTcTile != 0) return {};
  auto smem_of = [&](int64_t threads, int64_t size) {
    return tc_smem_bytes(D, static_cast<int>(threads / 32), static_cast<int>(size), static_cast<int>(hpb));
  };
  TcLaunch tuned;
  for (int64_t t = std::min<int64_t>(tuned_threads, dev.max_threads); t >= 64; t -= 32) {
    const int64_t smem = smem_of(t, partition_size);
    if (smem <= dev.max_smem) {
      tuned = {smem, partition_size, tuned_parts, t};
      break;
    }
  }
  if (tuned.smem == 0 || partition_size < kMaxPartitionSize || tuned_parts == 1) return tuned;

  auto resident = [&](int64_t threads, int64_t smem) {
    auto [it, added] = dev.resident.try_emplace({threads, smem}, 0);
    if (added && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, static_cast<int>(threads),
                                                               static_cast<size_t>(smem)) != cudaSuccess)
      it->second = 0;
    return it->second;
  };
  const int tuned_per_sm = resident(tuned.threads, tuned.smem);
  if (tuned_per_sm == 0 || blocks_per_partition * tuned_parts <= static_cast<int64_t>(dev.num_sms) * tuned_per_sm)
    return tuned;
  auto cost = [&](const TcLaunch& l, int per_sm) {
    const int64_t waves = ceil_div(blocks_per_partition * l.num_partitions, static_cast<int64_t>(per_sm) * dev.num_sms);
    return static_cast<double>(tuned_per_sm) / per_sm *  // at least 1: longer partitions, more shared memory
           static_cast<double>(waves * per_sm * (std::min(l.partition_size, max_seq_len) + kTcBlockOverheadTokens));
  };
  TcLaunch best = tuned;
  double best_cost = cost(tuned, tuned_per_sm);
  for (int64_t parts = tuned_parts - 1; parts >= std::max<int64_t>(ceil_div(tuned_parts, 2), tuned_parts - 15); --parts) {
    const int64_t size = ceil_div(ceil_div(max_seq_len, parts), kTcTile) * kTcTile;
    const TcLaunch longer{smem_of(tuned.threads, size), size, parts, tuned.threads};
    if (ceil_div(max_seq_len, size) != parts || longer.smem > dev.max_smem) continue;
    const int per_sm = resident(longer.threads, longer.smem);
    if (per_sm == 0) continue;
    if (const double c = cost(longer, per_sm); c < best_cost) {
      best = longer;
      best_cost = c;
    }
  }
  return best;
}

// num_threads, or the most whole warps below it that Kernel's registers allow on `device`
// (e.g. the CUDA-core kernel for bf16 and 8 heads per block cannot have 512 threads); the
// kernel runs with any number of warps. Asked once per kernel and device.
template <auto Kernel>
unsigned fitted_threads(int device, int64_t num_threads) {
  static std::atomic<int> max_threads[64];  // 0: not asked yet
  std::atomic<int>& known = max_threads[device % 64];
  int limit = known.load(std::memory_order_relaxed);
  if (limit == 0) {
    cudaFuncAttributes attr{};
    limit = cudaFuncGetAttributes(&attr, Kernel) == cudaSuccess ? attr.maxThreadsPerBlock / 32 * 32 : 1024;
    known.store(limit, std::memory_order_relaxed);
  }
  return static_cast<unsigned>(std::min<int64_t>(num_threads, limit));
}

// Calls f(TypeTag<C>{}) with the cache element type: T, or the FP8 format of an FP8 cache.
template <typename T, typename F>
void dispatch_cache_type(const Tensor& kv_cache, F&& f) {
  switch (kv_cache.scalar_type()) {
    case ScalarType::Float8_e4m3fn: return f(TypeTag<Fp8E4M3>{});
    case ScalarType::Float8_e5m2: return f(TypeTag<Fp8E5M2>{});
    default: return f(TypeTag<T>{});
  }
}

// The factor the raw FP8 decode of `kv_cache` is off by (kernels/kv_fp8.cuh), 1 for other caches.
float raw_factor(const Tensor& kv_cache) {
  if (kv_cache.scalar_type() == ScalarType::Float8_e4m3fn) return Fp8E4M3::kRawFactor;
  if (kv_cache.scalar_type() == ScalarType::Float8_e5m2) return Fp8E5M2::kRawFactor;
  return 1.f;
}

}  // namespace

void paged_attention_decode(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                            double scale, int64_t max_seq_len, int64_t partition_size, int64_t num_threads,
                            int64_t sliding_window, double logits_soft_cap, double k_scale, double v_scale) {
  const char* op = "paged_attention_decode";
  const PagedDecodeArgs a = check_paged_decode_args(out, query, kv_cache, block_table, seq_lens, scale, max_seq_len,
                                                    partition_size, num_threads, sliding_window, logits_soft_cap,
                                                    k_scale, v_scale);
  check_cuda(op, "query", query);
  const bool fp8 = is_fp8_cache(kv_cache);
  // FP8 caches are read by the FP16 / BF16 instances only (no float32 x FP8 kernels are built).
  VLLM_VOLTA_CHECK(!fp8 || query.scalar_type() != ScalarType::Float, op,
                  ": an FP8 'kv_cache' needs float16 or bfloat16 'query' / 'out', got float32");
  if (a.num_seqs == 0) return;
  // The kernel reads query/key/value rows with 16-byte loads.
  const int64_t q_stride = a.num_seqs > 1 ? query.stride(0) : a.num_heads * a.cache.head_size;
  VLLM_VOLTA_CHECK(is_aligned16(query.data_ptr()) && is_aligned16(kv_cache.data_ptr()) && is_aligned16(out.data_ptr()) &&
                      q_stride * static_cast<int64_t>(query.element_size()) % 16 == 0,
                  op, ": 'query' (data pointer and sequence stride), 'kv_cache' and 'out' must be 16-byte aligned");
  const int device = query.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(query);
  const int64_t d = a.cache.head_size;

  const int64_t hpb = heads_per_block(a.num_heads / a.cache.num_kv_heads);
  const int64_t blocks_per_partition = a.num_heads / hpb * a.num_seqs;
  TcLaunch tc;  // FP16 / BF16 run on tensor cores when a block fits (plan_tc_launch)
  auto plan = [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    dispatch_cache_type<T>(kv_cache, [&](auto cache_tag) {
      dispatch_head_size(d, [&](auto d_tag) {
        tc = plan_tc_launch<T, decltype(d_tag)::value, typename decltype(cache_tag)::type>(
            device, blocks_per_partition, a.max_span, partition_size, a.num_partitions,
            num_threads, hpb);
      });
    });
  };
  if (query.scalar_type() == ScalarType::Half) plan(TypeTag<__half>{});
  if (query.scalar_type() == ScalarType::BFloat16) plan(TypeTag<__nv_bfloat16>{});
  const int64_t part_size = tc.smem > 0 ? tc.partition_size : partition_size;
  const int64_t num_partitions = tc.smem > 0 ? tc.num_partitions : a.num_partitions;

  // fp32 scratch for split contexts: [seqs, heads, partitions] x (D outputs + max + sum).
  float* part_out = nullptr;
  float* part_max = nullptr;
  float* part_sum = nullptr;
  Tensor scratch;
  if (num_partitions > 1) {
    const int64_t rows = a.num_seqs * a.num_heads * num_partitions;
    const std::vector<int64_t> size{rows * (d + 2)};
    scratch = torch::stable::new_empty(query, size, ScalarType::Float);
    part_out = static_cast<float*>(scratch.data_ptr());
    part_max = part_out + rows * d;
    part_sum = part_max + rows;
  }
  // FP8: dot products of raw decoded keys, times scale * k_scale * raw factor (exactly `scale` otherwise).
  const float factor = raw_factor(kv_cache);
  const float score_scale = fp8 ? static_cast<float>(scale * k_scale * factor) : static_cast<float>(scale);
  const float out_scale = fp8 ? static_cast<float>(v_scale * factor) : 1.f;
  const PagedDecodeParams params{static_cast<int>(a.num_heads), static_cast<int>(a.cache.num_kv_heads),
                                 static_cast<int>(hpb), static_cast<int>(a.cache.block_size),
                                 static_cast<int>(part_size), static_cast<int>(num_partitions), q_stride,
                                 block_table.stride(0), a.cache.num_blocks * a.cache.block_size,
                                 score_scale, static_cast<int>(sliding_window),
                                 static_cast<float>(logits_soft_cap), out_scale};

  dispatch_float_type(op, query, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    T* out_ptr = static_cast<T*>(out.data_ptr());
    const dim3 grid(static_cast<unsigned>(a.num_heads / hpb), static_cast<unsigned>(a.num_seqs),
                    static_cast<unsigned>(num_partitions));
    const bool pdl = programmatic_launch_for(device, a.num_seqs);
    auto run = [&](auto cache_tag) {
      using C = typename decltype(cache_tag)::type;
      using S = typename CacheStorage<C>::type;
      const S* cache_ptr = static_cast<const S*>(kv_cache.data_ptr());
      dispatch_head_size(d, [&](auto d_tag) {
        constexpr int D = decltype(d_tag)::value;
        if constexpr (!std::is_same_v<T, float>) {
          if (tc.smem > 0) {
            const unsigned tc_threads = static_cast<unsigned>(tc.threads);
            launch_kernel(paged_attention_decode_tc_kernel<T, D, C>, grid, dim3(tc_threads),
                          static_cast<size_t>(tc.smem), stream, pdl, out_ptr, part_out, part_max, part_sum,
                          static_cast<const T*>(query.data_ptr()), cache_ptr,
                          static_cast<const int*>(block_table.data_ptr()), static_cast<const int*>(seq_lens.data_ptr()),
                          params);
            return;
          }
        }
        dispatch_heads_bound(hpb, [&](auto hpb_tag, auto exact_tag) {
          constexpr int HPB = decltype(hpb_tag)::value;
          constexpr bool EXACT = decltype(exact_tag)::value;
          const size_t smem = sizeof(float) * HPB * std::max<int64_t>(part_size, D);
          constexpr auto kernel = paged_attention_decode_kernel<T, D, HPB, EXACT, C>;
          launch_kernel(kernel, grid, dim3(fitted_threads<kernel>(device, num_threads)), smem, stream, pdl, out_ptr,
                        part_out, part_max, part_sum, static_cast<const T*>(query.data_ptr()), cache_ptr,
                        static_cast<const int*>(block_table.data_ptr()), static_cast<const int*>(seq_lens.data_ptr()),
                        params);
        });
      });
    };
    if constexpr (std::is_same_v<T, float>) {
      run(TypeTag<T>{});  // float32 queries never read FP8 caches (refused above)
    } else {
      dispatch_cache_type<T>(kv_cache, run);
    }
    if (num_partitions > 1) {
      const dim3 grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.num_seqs));
      launch_kernel(paged_attention_reduce_kernel<T>, grid, dim3(128), 0, stream, pdl, out_ptr, part_out, part_max,
                    part_sum, static_cast<const int*>(seq_lens.data_ptr()), static_cast<int>(d),
                    static_cast<int>(part_size), static_cast<int>(num_partitions), params.window);
    }
  });
  check_launch(op);
}

}  // namespace vllm_volta
