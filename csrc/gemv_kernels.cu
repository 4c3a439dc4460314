// Host launchers of gemv, rms_norm_gemv and silu_and_mul_gemv (device code: kernels/gemv.cuh).
// No host sync; CUDA-graph capturable.
#include "cuda_launch.h"
#include "gemv_checks.h"
#include "kernels/gemv.cuh"
#include "ops.h"

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
// per SM to balance over (benchmarks/kernels/benchmark_gemv.py: the fastest or within 1% on
// every Llama-3-8B and Qwen2.5-7B projection at 1 row).
constexpr int64_t kGemvDefaultRowsPerBlock = 4;

void check_aligned16(const char* op, const char* arg, const void* ptr) {
  VLLM_VOLTA_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, op, ": '", arg, "' must be 16-byte aligned");
}

// The fused prologues always run 4 rows per block (the automatic choice); only gemv takes
// rows_per_block.
template <GemvPrologue P>
void launch(const char* op, const Tensor& out, const Tensor& input, const GemvArgs& a, GemvInput in,
            const Tensor& weight, const std::optional<Tensor>& bias, int64_t rows_per_block) {
  check_cuda(op, "input", input);
  check_aligned16(op, "input", input.data_ptr());
  check_aligned16(op, "weight", weight.data_ptr());
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const int64_t rows = rows_per_block == 0 ? kGemvDefaultRowsPerBlock : rows_per_block;
  auto* o = static_cast<__half*>(out.data_ptr());
  const auto* w = static_cast<const __half*>(weight.data_ptr());
  const __half* b = bias.has_value() ? static_cast<const __half*>(bias->data_ptr()) : nullptr;
  const int n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  in.x = static_cast<const __half*>(input.data_ptr());
  in.x_stride = a.in_stride;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, rows)));
  dispatch_gemv_rows(a.m, [&](auto m_tag) {
    constexpr int M = decltype(m_tag)::value;
    if constexpr (P != GemvPrologue::kNone) {
      gemv_kernel<M, 4, 2, P><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, in, w, b, n, k);
      return;
    }
    switch (rows) {  // R rows x U vectors: 8 weight loads in flight per thread
      case 2: gemv_kernel<M, 2, 4, P><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, in, w, b, n, k); break;
      case 4: gemv_kernel<M, 4, 2, P><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, in, w, b, n, k); break;
      default: gemv_kernel<M, 8, 1, P><<<grid, kGemvThreads, 0, stream>>>(o, a.out_stride, in, w, b, n, k); break;
    }
  });
  check_launch(op);
}

}  // namespace

void gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block) {
  const GemvArgs a = check_gemv_args(out, input, weight, bias, rows_per_block);
  launch<GemvPrologue::kNone>("gemv", out, input, a, GemvInput{}, weight, bias, rows_per_block);
}

void rms_norm_gemv(Tensor out, Tensor input, std::optional<Tensor> residual, std::optional<Tensor> residual_out,
                   Tensor norm_weight, double epsilon, Tensor weight, std::optional<Tensor> bias) {
  const GemvArgs a =
      check_rms_norm_gemv_args(out, input, residual, residual_out, norm_weight, epsilon, weight, bias);
  const char* op = "rms_norm_gemv";
  GemvInput in{};
  in.norm_weight = static_cast<const __half*>(norm_weight.data_ptr());
  check_aligned16(op, "norm_weight", in.norm_weight);
  in.epsilon = static_cast<float>(epsilon);
  if (residual.has_value()) {
    in.residual = static_cast<const __half*>(residual->data_ptr());
    in.residual_out = static_cast<__half*>(residual_out->data_ptr());
    check_aligned16(op, "residual", in.residual);
    check_aligned16(op, "residual_out", in.residual_out);
    launch<GemvPrologue::kAddRmsNorm>(op, out, input, a, in, weight, bias, 0);
  } else {
    launch<GemvPrologue::kRmsNorm>(op, out, input, a, in, weight, bias, 0);
  }
}

void silu_and_mul_gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias) {
  const GemvArgs a = check_silu_and_mul_gemv_args(out, input, weight, bias);
  launch<GemvPrologue::kSiluAndMul>("silu_and_mul_gemv", out, input, a, GemvInput{}, weight, bias, 0);
}

}  // namespace vllm_volta
