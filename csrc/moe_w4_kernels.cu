// Host launchers of the 4-bit mixture-of-experts ops (device code: kernels/moe_w4.cuh). No host
// synchronization and grids from tensor shapes only, so they can be captured in a CUDA graph.
#include "cuda_launch.h"
#include "kernels/moe_w4.cuh"
#include "moe_w4_checks.h"
#include "ops.h"

#include <algorithm>

namespace vllm_volta {

namespace {

// Lanes per weight row: the widest team (32, 16, 8) whose lanes split the row's chunks evenly
// (Qwen3-30B-A3B: 64 chunks of H = 2048 -> 32; 24 chunks of I = 768 -> 8), else a whole warp.
int moe_w4_team_lanes(int64_t chunks) {
  for (int lanes : {32, 16, 8})
    if (chunks % lanes == 0) return lanes;
  return chunks < 8 ? 8 : 32;
}

template <typename F>
void dispatch_team(int lanes, F&& f) {
  switch (lanes) {
    case 8: return f(IntTag<8>{});
    case 16: return f(IntTag<16>{});
    default: return f(IntTag<32>{});
  }
}

void check_aligned16(const char* op, const Tensor& input, const Tensor& qweight) {
  VLLM_VOLTA_CHECK(is_aligned16(input.data_ptr()) && is_aligned16(qweight.data_ptr()), op,
                  ": 'input' and 'qweight' data must be 16-byte aligned");
}

}  // namespace

void moe_w4_gemv_act_and_mul(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                             int64_t activation) {
  const char* op = "moe_w4_gemv_act_and_mul";
  const MoeW4Args a = check_moe_w4_gemv_args(op, out, input, qweight, sz, topk_ids, std::nullopt, true);
  check_moe_w4_activation(op, activation);
  check_cuda(op, "input", input);
  check_aligned16(op, input, qweight);
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  dispatch_team(moe_w4_team_lanes(a.k / 32), [&](auto tl_tag) {
    constexpr int TL = decltype(tl_tag)::value;
    constexpr int kTeams = kMoeW4Threads / TL;
    const dim3 grid(static_cast<unsigned>(a.tokens * a.top_k), static_cast<unsigned>(ceil_div(a.n, kTeams)));
    VLLM_VOLTA_CHECK(grid.y < 65536, op, ": intermediate size ", a.n, " is too large");
    auto go = [&](auto kernel) {
      kernel<<<grid, kMoeW4Threads, 0, stream>>>(
          static_cast<__half*>(out.data_ptr()), static_cast<const __half*>(input.data_ptr()),
          static_cast<const int*>(qweight.data_ptr()), static_cast<const __half2*>(sz.data_ptr()),
          static_cast<const int*>(topk_ids.data_ptr()), static_cast<int>(a.top_k), static_cast<int>(a.experts),
          static_cast<int>(a.n), static_cast<int>(a.k), static_cast<int>(a.group_chunks));
    };
    if (activation == 0) {
      go(moe_w4_gemv_act_and_mul_kernel<TL, Activation::kSilu>);
    } else {
      go(moe_w4_gemv_act_and_mul_kernel<TL, Activation::kGeluTanh>);
    }
  });
  check_launch(op);
}

void moe_w4_gemv_down_sum(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                          Tensor topk_weights) {
  const char* op = "moe_w4_gemv_down_sum";
  const MoeW4Args a = check_moe_w4_gemv_args(op, out, input, qweight, sz, topk_ids, topk_weights, false);
  check_cuda(op, "input", input);
  check_aligned16(op, input, qweight);
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  dispatch_team(moe_w4_team_lanes(a.k / 32), [&](auto tl_tag) {
    constexpr int TL = decltype(tl_tag)::value;
    constexpr int kTeams = kMoeW4Threads / TL;
    // The block's teams split a token's experts (up to top_k groups, a power of two), the rest
    // of the teams take more rows: many small blocks keep the loads of a batch-1 step spread.
    int groups = 1;
    while (groups * 2 <= std::min<int64_t>(a.top_k, kTeams)) groups *= 2;
    const int rows = kTeams / groups;
    const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(ceil_div(a.n, rows)));
    VLLM_VOLTA_CHECK(grid.y < 65536, op, ": hidden size ", a.n, " is too large");
    moe_w4_gemv_down_sum_kernel<TL><<<grid, kMoeW4Threads, 0, stream>>>(
        static_cast<__half*>(out.data_ptr()), static_cast<const __half*>(input.data_ptr()),
        static_cast<const int*>(qweight.data_ptr()), static_cast<const __half2*>(sz.data_ptr()),
        static_cast<const int*>(topk_ids.data_ptr()), static_cast<const float*>(topk_weights.data_ptr()),
        static_cast<int>(a.top_k), static_cast<int>(a.experts), static_cast<int>(a.n), static_cast<int>(a.k),
        static_cast<int>(a.group_chunks), groups);
  });
  check_launch(op);
}

void moe_w4_dequantize(Tensor out, Tensor qweight, Tensor sz, Tensor experts) {
  const char* op = "moe_w4_dequantize";
  const MoeW4Args a = check_moe_w4_dequantize_args(out, qweight, sz, experts);
  check_cuda(op, "qweight", qweight);
  VLLM_VOLTA_CHECK(is_aligned16(out.data_ptr()) && is_aligned16(qweight.data_ptr()), op,
                  ": 'out' and 'qweight' data must be 16-byte aligned");
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(qweight.get_device_index());
  const int64_t chunks = a.tokens * a.n * (a.k / 32);
  // A grid of a few waves at most: each thread then takes several chunks.
  const int64_t blocks = std::min<int64_t>(ceil_div(chunks, 256), 65535);
  moe_w4_dequantize_kernel<<<static_cast<unsigned>(blocks), 256, 0, current_stream(qweight)>>>(
      static_cast<__half*>(out.data_ptr()), static_cast<const int*>(qweight.data_ptr()),
      static_cast<const __half2*>(sz.data_ptr()), static_cast<const int*>(experts.data_ptr()),
      static_cast<int>(a.tokens), static_cast<int>(a.experts), static_cast<int>(a.n), static_cast<int>(a.k),
      static_cast<int>(a.group_chunks));
  check_launch(op);
}

}  // namespace vllm_volta
