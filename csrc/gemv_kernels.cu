// Host launchers of gemv, gemv_silu_and_mul, gemv_add and gemv_rope_cache (device code:
// kernels/gemv.cuh). No host sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "gemv_checks.h"
#include "kernels/gemv.cuh"
#include "ops.h"

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
// per SM to balance over.
constexpr int64_t kGemvDefaultRowsPerBlock = 4;

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
  const int64_t rows = rows_per_block == 0 ? kGemvDefaultRowsPerBlock : rows_per_block;
  auto* o = static_cast<__half*>(out.data_ptr());
  const auto* x = static_cast<const __half*>(input.data_ptr());
  const auto* w = static_cast<const __half*>(weight.data_ptr());
  const __half* b = bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr;
  const __half* g = norm_weight.has_value() ? static_cast<const __half*>(norm_weight->data_ptr()) : nullptr;
  const float eps = static_cast<float>(epsilon);
  // The kernel's n: output features, or (kRopeCache) rotation pairs.
  const int n = static_cast<int>(E == GemvEpilogue::kRopeCache ? a.n / 2 : a.n), k = static_cast<int>(a.k);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, PAIRED ? rows / 2 : rows)));
  auto launch = [&](auto m_tag, auto norm_tag) {
    constexpr int M = decltype(m_tag)::value;
    constexpr bool NORM = decltype(norm_tag)::value;
    auto go = [&](auto kernel) {
      launch_kernel(kernel, grid, dim3(kGemvThreads), 0, stream, device, o, a.out_stride, x, a.in_stride, w, b, n,
                    k, g, eps, rope);
    };
    switch (rows) {  // R rows x U vectors: 8 weight loads in flight per thread
      case 2: go(gemv_kernel<M, 2, 4, E, NORM>); break;
      case 4: go(gemv_kernel<M, 4, 2, E, NORM>); break;
      default: go(gemv_kernel<M, 8, 1, E, NORM>); break;
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
