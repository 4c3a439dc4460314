// Host launchers of the Gated DeltaNet ops (device code: kernels/gated_delta_rule.cuh and
// kernels/causal_conv1d.cuh). Volta-safe (FP16 / FP32 FMA only), registered for CUDA in every
// build; no host sync, grids depend only on tensor shapes (CUDA-graph safe).
#include "cuda_launch.h"
#include "gdn_checks.h"
#include "kernels/causal_conv1d.cuh"
#include "kernels/gated_delta_rule.cuh"
#include "kernels/gated_rms_norm.cuh"
#include "ops.h"

#include <algorithm>
#include <type_traits>

namespace vllm_volta {

namespace {

// The gate inputs' element type code for the kernel; bf16 only where the build and GPU have it.
int gate_type(const char* op, const Tensor& t) {
  int code = kGdnF32;
  dispatch_float_type(op, t, [&](auto tag) {
    using G = typename decltype(tag)::type;
    code = std::is_same_v<G, __half> ? kGdnF16 : std::is_same_v<G, float> ? kGdnF32 : kGdnBF16;
  });
  return code;
}

int sm_count(int device) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return std::max(sms, 1);
}

// Threads across a row of the state tile (each owns 4 columns). Measured on an H200 (Qwen3.5-9B
// layer: 32 value heads of 128 x 128, fp16, 2026-12-03), 4 was the fastest at every batch size
// tried, both builds: batch 1 3.96 us (2: 4.33, 8: 4.26), batch 64 92.5 us (2: 137.8, 8: 101.8),
// batch 256 356 us (8: 398). 2 is kept for grids too small to give every SM a block at 4.
int auto_col_threads(int64_t seqs, int64_t hv, int64_t dv, int sms) {
  const int64_t blocks_at_4 = seqs * hv * ceil_div(dv, 16);
  return blocks_at_4 >= sms ? 4 : 2;
}

template <typename T, typename S, int kVec, int kColThreads>
void launch_gdn_tile(const GdnParams& p, int64_t seqs, int max_dk, cudaStream_t stream) {
  constexpr int kCols = kColThreads * kVec;
  const dim3 grid(static_cast<unsigned>(p.num_v_heads * ceil_div(p.dv, kCols)), static_cast<unsigned>(seqs));
  const bool varlen = p.query_start_loc != nullptr;
  if (max_dk <= 128) {
    auto kernel = varlen ? gated_delta_rule_kernel<T, S, kVec, kColThreads, 128, true>
                         : gated_delta_rule_kernel<T, S, kVec, kColThreads, 128, false>;
    kernel<<<grid, kGdnThreads, 0, stream>>>(p);
  } else {
    auto kernel = varlen ? gated_delta_rule_kernel<T, S, kVec, kColThreads, 256, true>
                         : gated_delta_rule_kernel<T, S, kVec, kColThreads, 256, false>;
    kernel<<<grid, kGdnThreads, 0, stream>>>(p);
  }
}

template <typename T, typename S>
void launch_gdn_typed(const GdnParams& p, int64_t seqs, int col_threads, bool vec4, cudaStream_t stream) {
  if (!vec4) return launch_gdn_tile<T, S, 1, 8>(p, seqs, p.dk, stream);
  if (col_threads == 2) return launch_gdn_tile<T, S, 4, 2>(p, seqs, p.dk, stream);
  if (col_threads == 4) return launch_gdn_tile<T, S, 4, 4>(p, seqs, p.dk, stream);
  return launch_gdn_tile<T, S, 4, 8>(p, seqs, p.dk, stream);
}

void run_gated_delta_rule(const char* op, Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                          Tensor state_slots, std::optional<Tensor> query_start_loc,
                          std::optional<Tensor> has_initial_state, double scale, bool qk_l2norm,
                          std::optional<Tensor> A_log, std::optional<Tensor> dt_bias, int64_t col_threads) {
  const GdnArgs r = check_gated_delta_rule_args(op, out, q, k, v, a, b, state, state_slots, query_start_loc,
                                                has_initial_state, scale, A_log, dt_bias);
  VLLM_VOLTA_CHECK(col_threads == 0 || col_threads == 2 || col_threads == 4 || col_threads == 8, op,
                  ": 'col_threads' must be 0 (automatic), 2, 4 or 8, got ", col_threads);
  check_cuda(op, "q", q);
  VLLM_VOLTA_CHECK(r.seqs <= 65535, op, ": at most 65535 sequences per launch, got ", r.seqs);
  if (r.seqs == 0) return;
  const int device = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  GdnParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_stride = r.q_stride;
  p.k_stride = r.k_stride;
  p.v_stride = r.v_stride;
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.a_stride = r.a_stride;
  p.b_stride = r.b_stride;
  p.a_type = gate_type(op, a);
  p.b_type = gate_type(op, b);
  if (A_log.has_value()) {
    p.A_log = A_log->data_ptr();
    p.dt_bias = dt_bias->data_ptr();
    p.A_log_type = gate_type(op, *A_log);
    p.dt_bias_type = gate_type(op, *dt_bias);
  }
  p.state = state.data_ptr();
  p.state_slots = static_cast<const int*>(state_slots.data_ptr());
  p.query_start_loc = query_start_loc.has_value() ? static_cast<const int*>(query_start_loc->data_ptr()) : nullptr;
  p.has_initial_state =
      has_initial_state.has_value() ? static_cast<const bool*>(has_initial_state->data_ptr()) : nullptr;
  p.out = out.data_ptr();
  p.num_k_heads = static_cast<int>(r.num_k_heads);
  p.num_v_heads = static_cast<int>(r.num_v_heads);
  p.dk = static_cast<int>(r.dk);
  p.dv = static_cast<int>(r.dv);
  p.scale = static_cast<float>(scale);
  p.qk_l2norm = qk_l2norm;

  const bool state_f32 = state.scalar_type() == ScalarType::Float;
  const int64_t state_elem = state_f32 ? 4 : 2;
  const bool vec4 = r.dv % 4 == 0 && reinterpret_cast<uintptr_t>(p.state) % (4 * state_elem) == 0;
  const int ct = col_threads != 0 ? static_cast<int>(col_threads)
                                  : auto_col_threads(r.seqs, r.num_v_heads, r.dv, sm_count(device));
  const cudaStream_t stream = current_stream(q);
  dispatch_float_type(op, q, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (state_f32) {
      launch_gdn_typed<T, float>(p, r.seqs, ct, vec4, stream);
    } else {
      launch_gdn_typed<T, T>(p, r.seqs, ct, vec4, stream);
    }
  });
  check_launch(op);
}

template <typename T>
ConvParams<T> conv_params(const ConvArgs& r, Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias,
                          Tensor conv_state, Tensor state_slots, std::optional<Tensor> query_start_loc,
                          std::optional<Tensor> has_initial_state, bool silu) {
  ConvParams<T> p{};
  p.x = static_cast<const T*>(x.data_ptr());
  p.x_stride = r.x_stride;
  p.out = static_cast<T*>(out.data_ptr());
  p.weight = static_cast<const T*>(weight.data_ptr());
  p.bias = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  p.conv_state = static_cast<T*>(conv_state.data_ptr());
  p.st_slot = r.st_slot;
  p.st_chan = r.st_chan;
  p.st_pos = r.st_pos;
  p.state_slots = static_cast<const int*>(state_slots.data_ptr());
  p.query_start_loc = query_start_loc.has_value() ? static_cast<const int*>(query_start_loc->data_ptr()) : nullptr;
  p.has_initial_state =
      has_initial_state.has_value() ? static_cast<const bool*>(has_initial_state->data_ptr()) : nullptr;
  p.channels = static_cast<int>(r.channels);
  p.num_tokens = static_cast<int>(r.tokens);
  p.num_seqs = static_cast<int>(r.seqs);
  p.silu = silu;
  return p;
}

// f(IntTag<W>{}) for the kernel size W in [kConvMinWidth, kConvMaxWidth] (checked before).
template <typename F>
void dispatch_conv_width(int64_t width, F&& f) {
  if (width == 2) return f(IntTag<2>{});
  if (width == 3) return f(IntTag<3>{});
  return f(IntTag<4>{});
}

}  // namespace

void gated_delta_rule_decode(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                             Tensor state_slots, double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                             std::optional<Tensor> dt_bias, int64_t col_threads) {
  run_gated_delta_rule("gated_delta_rule_decode", out, q, k, v, a, b, state, state_slots, std::nullopt, std::nullopt,
                       scale, qk_l2norm, A_log, dt_bias, col_threads);
}

void gated_delta_rule_prefill(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                              Tensor state_slots, Tensor query_start_loc, std::optional<Tensor> has_initial_state,
                              double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                              std::optional<Tensor> dt_bias, int64_t col_threads) {
  run_gated_delta_rule("gated_delta_rule_prefill", out, q, k, v, a, b, state, state_slots, query_start_loc,
                       has_initial_state, scale, qk_l2norm, A_log, dt_bias, col_threads);
}

void causal_conv1d_update(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                          Tensor state_slots, bool silu) {
  const char* op = "causal_conv1d_update";
  const ConvArgs r =
      check_causal_conv1d_args(op, out, x, weight, bias, conv_state, state_slots, std::nullopt, std::nullopt);
  check_cuda(op, "x", x);
  VLLM_VOLTA_CHECK(r.seqs <= 65535, op, ": at most 65535 sequences per launch, got ", r.seqs);
  if (r.seqs == 0 || r.channels == 0) return;
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const cudaStream_t stream = current_stream(x);
  const dim3 grid(static_cast<unsigned>(ceil_div(r.channels, kConvThreads)), static_cast<unsigned>(r.seqs));
  dispatch_float_type(op, x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConvParams<T> p =
        conv_params<T>(r, out, x, weight, bias, conv_state, state_slots, std::nullopt, std::nullopt, silu);
    dispatch_conv_width(r.width, [&](auto w) {
      causal_conv1d_update_kernel<T, decltype(w)::value><<<grid, kConvThreads, 0, stream>>>(p);
    });
  });
  check_launch(op);
}

void causal_conv1d_fn(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                      Tensor query_start_loc, Tensor state_slots, std::optional<Tensor> has_initial_state,
                      bool silu) {
  const char* op = "causal_conv1d_fn";
  const ConvArgs r =
      check_causal_conv1d_args(op, out, x, weight, bias, conv_state, state_slots, query_start_loc, has_initial_state);
  check_cuda(op, "x", x);
  VLLM_VOLTA_CHECK(r.seqs <= 65535, op, ": at most 65535 sequences per launch, got ", r.seqs);
  if (r.seqs == 0 || r.channels == 0) return;
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const cudaStream_t stream = current_stream(x);
  const unsigned chan_blocks = static_cast<unsigned>(ceil_div(r.channels, kConvThreads));
  dispatch_float_type(op, x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConvParams<T> p =
        conv_params<T>(r, out, x, weight, bias, conv_state, state_slots, query_start_loc, has_initial_state, silu);
    dispatch_conv_width(r.width, [&](auto w) {
      constexpr int W = decltype(w)::value;
      // Outputs first (reading the old states), then the states: stream order keeps them apart.
      if (r.tokens > 0) {
        const dim3 grid(chan_blocks, static_cast<unsigned>(std::min<int64_t>(r.tokens, 65535)));
        causal_conv1d_fwd_kernel<T, W><<<grid, kConvThreads, 0, stream>>>(p);
      }
      causal_conv1d_state_kernel<T, W><<<dim3(chan_blocks, static_cast<unsigned>(r.seqs)), kConvThreads, 0, stream>>>(p);
    });
  });
  check_launch(op);
}

void gated_rms_norm(Tensor out, Tensor x, Tensor gate, Tensor weight, double epsilon) {
  const char* op = "gated_rms_norm";
  const GatedNormArgs r = check_gated_rms_norm_args(out, x, gate, weight, epsilon);
  check_cuda(op, "x", x);
  const int64_t num_rows = r.tokens * (r.width / r.dim);
  if (num_rows == 0) return;
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const cudaStream_t stream = current_stream(x);
  const int64_t rows_per_block = kGatedNormThreads / 32;
  const unsigned blocks = static_cast<unsigned>(ceil_div(num_rows, rows_per_block));
  dispatch_float_type(op, x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const GatedNormParams<T> p{static_cast<T*>(out.data_ptr()), static_cast<const T*>(x.data_ptr()),
                               static_cast<const T*>(gate.data_ptr()), static_cast<const T*>(weight.data_ptr()),
                               r.out_stride, r.x_stride, r.gate_stride, num_rows,
                               static_cast<int>(r.width / r.dim), static_cast<int>(r.dim),
                               static_cast<float>(epsilon)};
    gated_rms_norm_kernel<T><<<blocks, kGatedNormThreads, 0, stream>>>(p);
  });
  check_launch(op);
}

}  // namespace vllm_volta
