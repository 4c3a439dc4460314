// Host launchers of gemv, gemv_silu_and_mul, gemv_add and gemv_rope_cache (device code:
// kernels/gemv.cuh). No host sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "gemv_checks.h"
#include "kernels/gemv.cuh"
#include "ops.h"

#include <atomic>
#include <limits>
#include <utility>

namespace vllm_volta {

namespace {

// Calls f(IntTag<M>{}) for 1 <= M <= kGemvMaxRows (checked before).
template <typename F>
void dispatch_gemv_rows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(IntTag<1>{});
    case 2: return f(IntTag<2>{});
    case 3: return f(IntTag<3>{});
    default: return f(IntTag<4>{});
  }
}

// Weight rows per block when the caller leaves it to us: 4, so that each thread has 8
// loads in flight (2 steps x 4 rows) and the smallest decode GEMVs still have ~8 blocks
// per SM to balance over; 8 (1 step x 8 rows) where a row has at most kGemvThreads 16-byte
// vectors (K <= 2048), whose second step would be empty and leave 4 loads in flight. Half
// the blocks cost nothing there: H200, Qwen2.5-1.5B shapes (K = 1536), 1 row: gate_up
// 16.4 -> 14.3 us, qkv 3.51 -> 3.39 us, o_proj (1536 rows, 192 blocks) 3.16 -> 3.15 us.
int64_t auto_rows_per_block(int64_t k) { return k / 8 <= kGemvThreads ? 8 : 4; }

// Threads per block: where one step of U vectors per thread covers a row (k / 8 <= kGemvThreads
// x U), the fewest whole warps that still do, so that no thread idles (K = 1536, 8 rows x 1
// vector: 192 threads instead of 256, of which 64 had nothing to load; K = 3584, 4 rows x 2
// vectors: 224 instead of 256); the smaller blocks leave room for more of them on an SM.
// Otherwise kGemvThreads. H200, Qwen2.5-1.5B shapes at 2 rows: gate_up 16.2 -> 15.0 us, o_proj
// 3.63 -> 3.52 us, decode at batch 2 1.466 -> 1.396 ms per token; 1 row and K = 3584 unchanged.
int gemv_threads(int64_t k, int u) {
  const int64_t per_thread = ceil_div(k / 8, u);
  // K >= 8 (checked): at least one vector, so at least one warp.
  return per_thread <= kGemvThreads ? round_up(static_cast<int>(per_thread), 32) : kGemvThreads;
}

// The grid of a kAdd or kRopeCache launch, whose groups end in a global read (the residual;
// position, cos / sin and slot): where launches are plain (below SM90, Volta mode, 1-2 rows:
// programmatic_launch_for), one wave of resident blocks with equal shares of the groups, each
// block loading its next group's weights during that read (gemv_kernel with MULTI). Batch-1
// Llama-3-8B decode in Volta mode on an H200: o_proj / down_proj 20.5 -> 19.5-19.7 us, qkv
// 17.3 -> 16.1-16.2 us per call, 2% per token. Otherwise `groups`: a block per group
// (programmatic dependents need free slots to start early; with them the one-wave grid made
// that decode 0.7% slower).
template <int M, int R, int U, GemvEpilogue E, bool NORM>
unsigned shared_groups_grid(unsigned groups, int threads, int device, bool programmatic) {
  constexpr int kMaxDevices = 64;
  if (device < 0 || device >= kMaxDevices || programmatic) return groups;
  // Resident blocks on the device per block size (threads / 32 - 1), 0 unknown.
  static std::atomic<int> slots[kMaxDevices][kGemvThreads / 32];
  std::atomic<int>& known = slots[device][threads / 32 - 1];
  int s = known.load(std::memory_order_relaxed);
  if (s == 0) {
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<M, R, U, E, NORM, true>, threads, 0) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
    s = per_sm * sms > 0 ? per_sm * sms : std::numeric_limits<int>::max();  // unknown: a block per group
    known.store(s, std::memory_order_relaxed);
  }
  return static_cast<unsigned>(ceil_div(groups, ceil_div(groups, s)));
}

template <GemvEpilogue E>
void launch_gemv(const char* op, Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias,
                 int64_t rows_per_block, std::optional<Tensor> norm_weight = std::nullopt, double epsilon = 0.0,
                 const GemvRope& rope = {}) {
  constexpr bool GATED = E == GemvEpilogue::kSiluAndMul;
  constexpr bool PAIRED = GATED || E == GemvEpilogue::kRopeCache;  // a block's rows come in pairs
  const GemvArgs a = check_gemv_args(op, out, input, weight, bias, rows_per_block, GATED, norm_weight, epsilon);
  check_cuda(op, "input", input);
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(weight.data_ptr()) &&
                      (!norm_weight.has_value() || is_aligned16(norm_weight->data_ptr())),
                  op, ": 'input', 'weight' and 'norm_weight' must be 16-byte aligned");
  // Other blocks still read the input while a block writes its outputs.
  auto span = [](const Tensor& t) {
    const auto* begin = static_cast<const char*>(t.data_ptr());
    return std::make_pair(begin, begin + ((t.size(0) - 1) * t.stride(0) + t.size(1)) * t.element_size());
  };
  const auto [out_begin, out_end] = span(out);
  const auto [in_begin, in_end] = span(input);
  VLLM_VOLTA_CHECK(out_end <= in_begin || in_end <= out_begin, op, ": 'out' must not overlap 'input'");
  const int device = input.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(input);
  const int64_t rows = rows_per_block == 0 ? auto_rows_per_block(a.k) : rows_per_block;
  auto* o = static_cast<__half*>(out.data_ptr());
  const auto* x = static_cast<const __half*>(input.data_ptr());
  const auto* w = static_cast<const __half*>(weight.data_ptr());
  const __half* b = bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr;
  const __half* g = norm_weight.has_value() ? static_cast<const __half*>(norm_weight->data_ptr()) : nullptr;
  const float eps = static_cast<float>(epsilon);
  // The kernel's n: output features, or (kRopeCache) rotation pairs.
  const int n = static_cast<int>(E == GemvEpilogue::kRopeCache ? a.n / 2 : a.n), k = static_cast<int>(a.k);
  const auto groups = static_cast<unsigned>(ceil_div(n, PAIRED ? rows / 2 : rows));
  const bool pdl = programmatic_launch_for(device, a.m);
  auto launch = [&](auto m_tag, auto norm_tag) {
    constexpr int M = decltype(m_tag)::value;
    constexpr bool NORM = decltype(norm_tag)::value;
    auto go = [&](auto r_tag, auto u_tag) {
      constexpr int R = decltype(r_tag)::value, U = decltype(u_tag)::value;
      const int threads = gemv_threads(k, U);
      auto launch_with = [&](auto kernel, unsigned blocks) {
        launch_kernel(kernel, dim3(blocks), dim3(threads), 0, stream, pdl, o, a.out_stride, x, a.in_stride, w, b, n,
                      k, g, eps, rope);
      };
      if constexpr (E == GemvEpilogue::kAdd || E == GemvEpilogue::kRopeCache) {
        if (const unsigned blocks = shared_groups_grid<M, R, U, E, NORM>(groups, threads, device, pdl); blocks < groups)
          return launch_with(gemv_kernel<M, R, U, E, NORM, true>, blocks);
      }
      launch_with(gemv_kernel<M, R, U, E, NORM, false>, groups);
    };
    switch (rows) {  // R rows x U vectors: 8 weight loads in flight per thread
      case 2: go(IntTag<2>{}, IntTag<4>{}); break;
      case 4: go(IntTag<4>{}, IntTag<2>{}); break;
      default: go(IntTag<8>{}, IntTag<1>{}); break;
    }
  };
  dispatch_gemv_rows(a.m, [&](auto m_tag) {
    if constexpr (E == GemvEpilogue::kAdd) {  // o_proj / down_proj: their inputs are not normalized
      launch(m_tag, std::false_type{});
    } else if (g != nullptr) {
      launch(m_tag, std::true_type{});
    } else {
      launch(m_tag, std::false_type{});
    }
  });
  check_launch(op);
}

}  // namespace

void gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
          std::optional<Tensor> norm_weight, double epsilon) {
  launch_gemv<GemvEpilogue::kNone>("gemv", out, input, weight, bias, rows_per_block, norm_weight, epsilon);
}

void gemv_silu_and_mul(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
                       std::optional<Tensor> norm_weight, double epsilon) {
  launch_gemv<GemvEpilogue::kSiluAndMul>("gemv_silu_and_mul", out, input, weight, bias, rows_per_block,
                                         norm_weight, epsilon);
}

void gemv_rope_cache(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, Tensor positions,
                     Tensor kv_cache, Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox,
                     std::optional<Tensor> norm_weight, double epsilon) {
  const char* op = "gemv_rope_cache";
  const GemvRopeArgs r = check_gemv_rope_args(out, input, weight, bias, positions, kv_cache, slot_mapping,
                                              cos_sin_cache, norm_weight, epsilon);
  const GemvRope rope{static_cast<const int64_t*>(positions.data_ptr()),
                      cos_sin_cache.data_ptr(),
                      cos_sin_cache.scalar_type() == ScalarType::Float,
                      is_neox,
                      cos_sin_cache.stride(0),
                      cos_sin_cache.size(0),
                      static_cast<int>(r.head_size),
                      static_cast<int>(r.q_size),
                      static_cast<int>(r.kv_size),
                      static_cast<__half*>(kv_cache.data_ptr()),
                      static_cast<const int64_t*>(slot_mapping.data_ptr()),
                      r.num_slots};
  launch_gemv<GemvEpilogue::kRopeCache>(op, out, input, weight, bias, 0, norm_weight, epsilon, rope);
}

void gemv_add(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block) {
  launch_gemv<GemvEpilogue::kAdd>("gemv_add", out, input, weight, bias, rows_per_block);
}

}  // namespace vllm_volta
