// Host launchers of the mixture-of-experts ops (device code: kernels/moe_routing.cuh,
// kernels/moe_gemv.cuh, kernels/moe_gemm.cuh). None synchronizes with the host and every grid
// depends only on tensor shapes, so all of them can be captured in a CUDA graph.
#include "cuda_launch.h"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_gemv.cuh"
#include "kernels/moe_routing.cuh"
#include "moe_checks.h"
#include "ops.h"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

namespace vllm_volta {

namespace {

template <MoeScore S>
void launch_topk(const char* op, Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices,
                 Tensor gating_output) {
  const MoeRoutingArgs a = check_topk_args(op, topk_weights, topk_ids, token_expert_indices, gating_output);
  check_cuda(op, "gating_output", gating_output);
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(gating_output.get_device_index());
  const cudaStream_t stream = current_stream(gating_output);
  const auto blocks = static_cast<unsigned>(ceil_div(a.tokens, kTopkWarps));
  dispatch_float_type(op, gating_output, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    topk_kernel<T, S><<<blocks, kTopkWarps * 32, 0, stream>>>(
        static_cast<float*>(topk_weights.data_ptr()), static_cast<int*>(topk_ids.data_ptr()),
        static_cast<int*>(token_expert_indices.data_ptr()), static_cast<const T*>(gating_output.data_ptr()),
        static_cast<int>(a.tokens), static_cast<int>(a.experts), static_cast<int>(a.top_k));
  });
  check_launch(op);
}

// Weight rows per block when left to us: 8 where the rows are short (at most one step of 256
// threads x 2 vectors covers them: more blocks would each do too little), else 4.
int moe_auto_rows(int64_t nvec) { return nvec <= kMoeGemvThreads * kMoeGemvSteps ? 8 : 4; }

// The fewest whole warps whose two steps cover a row, at most kMoeGemvThreads.
int moe_gemv_threads(int64_t nvec) {
  const int64_t per_thread = ceil_div(nvec, kMoeGemvSteps);
  return per_thread >= kMoeGemvThreads ? kMoeGemvThreads : round_up(static_cast<int>(per_thread), 32);
}

template <typename F>
void dispatch_moe_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 2: return f(IntTag<2>{});
    case 4: return f(IntTag<4>{});
    default: return f(IntTag<8>{});
  }
}

void check_aligned(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    VLLM_VOLTA_CHECK(is_aligned16(t->data_ptr()), op, ": the input, weight and output data must be 16-byte aligned");
}

}  // namespace

void topk_softmax(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output) {
  launch_topk<MoeScore::kSoftmax>("topk_softmax", topk_weights, topk_ids, token_expert_indices, gating_output);
}

void topk_sigmoid(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output) {
  launch_topk<MoeScore::kSigmoid>("topk_sigmoid", topk_weights, topk_ids, token_expert_indices, gating_output);
}

void moe_align_block_size(Tensor topk_ids, int64_t num_experts, int64_t block_size, Tensor sorted_token_ids,
                          Tensor experts_ids, Tensor num_tokens_post_pad) {
  const char* op = "moe_align_block_size";
  const int64_t pairs =
      check_moe_align_args(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad);
  check_cuda(op, "topk_ids", topk_ids);
  VLLM_VOLTA_CHECK(sorted_token_ids.size(0) < (int64_t{1} << 31) && experts_ids.size(0) < (int64_t{1} << 31), op,
                  ": 'sorted_token_ids' and 'experts_ids' must have fewer than 2^31 entries");
  torch::stable::accelerator::DeviceGuard guard(topk_ids.get_device_index());
  moe_align_block_size_kernel<<<1, kAlignThreads, 0, current_stream(topk_ids)>>>(
      static_cast<const int*>(topk_ids.data_ptr()), static_cast<int>(pairs), static_cast<int>(num_experts),
      static_cast<int>(block_size), static_cast<int*>(sorted_token_ids.data_ptr()),
      static_cast<int>(sorted_token_ids.size(0)), static_cast<int*>(experts_ids.data_ptr()),
      static_cast<int>(experts_ids.size(0)), static_cast<int*>(num_tokens_post_pad.data_ptr()));
  check_launch(op);
}

void moe_sum(Tensor input, Tensor output) {
  const char* op = "moe_sum";
  check_moe_sum_args(input, output);
  check_cuda(op, "input", input);
  if (output.numel() == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const int hidden = static_cast<int>(output.size(1));
  dispatch_float_type(op, input, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    moe_sum_kernel<T><<<static_cast<unsigned>(output.size(0)), round_up(std::min(hidden, 1024), 32), 0, stream>>>(
        static_cast<T*>(output.data_ptr()), static_cast<const T*>(input.data_ptr()), static_cast<int>(input.size(1)),
        hidden);
  });
  check_launch(op);
}

namespace {

template <Activation A>
void launch_moe_gemv_act_and_mul(const char* op, Tensor out, Tensor input, Tensor w13, Tensor topk_ids,
                                 int64_t rows_per_block) {
  const MoeGemvArgs a = check_moe_gemv_args(op, out, input, w13, topk_ids, std::nullopt, rows_per_block, true);
  check_cuda(op, "input", input);
  check_aligned(op, {&out, &input, &w13});
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const int64_t nvec = a.k / moe_vec_elems(input.scalar_type());
  const int64_t rows = rows_per_block == 0 ? moe_auto_rows(nvec) : rows_per_block;
  const int threads = moe_gemv_threads(nvec);
  dispatch_float_type(op, input, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    dispatch_moe_rows(rows, [&](auto r_tag) {
      constexpr int R = decltype(r_tag)::value;
      // Pairs on x (up to 2^31 - 1), feature groups on y (< 65536: checked).
      const dim3 grid(static_cast<unsigned>(a.tokens * a.top_k), static_cast<unsigned>(ceil_div(a.n, R / 2)));
      VLLM_VOLTA_CHECK(grid.y < 65536, op, ": intermediate size ", a.n, " needs more rows per block");
      moe_gemv_act_and_mul_kernel<T, R, A><<<grid, threads, 0, stream>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(input.data_ptr()),
          static_cast<const T*>(w13.data_ptr()), static_cast<const int*>(topk_ids.data_ptr()),
          static_cast<int>(a.top_k), static_cast<int>(a.experts), static_cast<int>(a.n), static_cast<int>(a.k));
    });
  });
  check_launch(op);
}

}  // namespace

void moe_gemv_silu_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block) {
  launch_moe_gemv_act_and_mul<Activation::kSilu>("moe_gemv_silu_and_mul", out, input, w13, topk_ids, rows_per_block);
}

void moe_gemv_gelu_tanh_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block) {
  launch_moe_gemv_act_and_mul<Activation::kGeluTanh>("moe_gemv_gelu_tanh_and_mul", out, input, w13, topk_ids,
                                                     rows_per_block);
}

void moe_gemv_down_sum(Tensor out, Tensor input, Tensor w2, Tensor topk_ids, Tensor topk_weights,
                       int64_t rows_per_block) {
  const char* op = "moe_gemv_down_sum";
  const MoeGemvArgs a = check_moe_gemv_args(op, out, input, w2, topk_ids, topk_weights, rows_per_block, false);
  check_cuda(op, "input", input);
  check_aligned(op, {&out, &input, &w2});
  if (a.tokens == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const int64_t nvec = a.k / moe_vec_elems(input.scalar_type());
  const int64_t rows = rows_per_block == 0 ? moe_auto_rows(nvec) : rows_per_block;
  const int group_threads = moe_gemv_threads(nvec);
  // Groups of threads on different experts at once, up to kMoeGemvThreads in all.
  const int threads = group_threads * static_cast<int>(std::min<int64_t>(a.top_k, kMoeGemvThreads / group_threads));
  dispatch_float_type(op, input, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    dispatch_moe_rows(rows, [&](auto r_tag) {
      constexpr int R = decltype(r_tag)::value;
      const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(ceil_div(a.n, R)));
      VLLM_VOLTA_CHECK(grid.y < 65536, op, ": hidden size ", a.n, " needs more rows per block");
      moe_gemv_down_sum_kernel<T, R><<<grid, threads, 0, stream>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(input.data_ptr()),
          static_cast<const T*>(w2.data_ptr()), static_cast<const int*>(topk_ids.data_ptr()),
          static_cast<const float*>(topk_weights.data_ptr()), static_cast<int>(a.top_k), static_cast<int>(a.experts),
          static_cast<int>(a.n), static_cast<int>(a.k), group_threads);
    });
  });
  check_launch(op);
}

void moe_grouped_gemm(Tensor out, Tensor input, Tensor weight, Tensor sorted_token_ids, Tensor experts_ids,
                      Tensor num_tokens_post_pad, std::optional<Tensor> topk_weights, int64_t top_k,
                      int64_t block_size) {
  const char* op = "moe_grouped_gemm";
  const MoeGemmArgs a = check_moe_gemm_args(out, input, weight, sorted_token_ids, experts_ids, num_tokens_post_pad,
                                            topk_weights, top_k, block_size);
  check_cuda(op, "input", input);
  check_aligned(op, {&input, &weight});
  VLLM_VOLTA_CHECK(a.max_blocks < 65536, op, ": too many sorted blocks (", a.max_blocks,
                  "); use a larger block_size");
  if (a.pairs == 0 || a.max_blocks == 0) return;
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const cudaStream_t stream = current_stream(input);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, kMoeGemmBN)), static_cast<unsigned>(a.max_blocks));
  const float* w = topk_weights.has_value() ? static_cast<const float*>(topk_weights->data_ptr()) : nullptr;
  auto go = [&](auto type_tag, auto bm_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int BM = decltype(bm_tag)::value;
    moe_grouped_gemm_kernel<T, BM><<<grid, kMoeGemmThreads, 0, stream>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(input.data_ptr()),
        static_cast<const T*>(weight.data_ptr()), static_cast<const int*>(sorted_token_ids.data_ptr()),
        static_cast<const int*>(experts_ids.data_ptr()), static_cast<const int*>(num_tokens_post_pad.data_ptr()), w,
        static_cast<int>(a.pairs), static_cast<int>(top_k), static_cast<int>(a.n), static_cast<int>(a.k));
  };
  dispatch_float_type(op, input, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    if constexpr (!std::is_same_v<T, float>) {  // float32 was refused by the checks
      switch (block_size) {
        case 16: go(type_tag, IntTag<16>{}); break;
        case 32: go(type_tag, IntTag<32>{}); break;
        default: go(type_tag, IntTag<64>{}); break;
      }
    }
  });
  check_launch(op);
}

}  // namespace vllm_volta
