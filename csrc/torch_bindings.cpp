// The _C op library: every schema declared once (vLLM's schemas), plus the
// registrations that exist in every build. One kernel per (op, dispatch key):
//   CPU   : the V100 adapter functions (device-agnostic torch::stable code)
//   Meta  : validation only (shape/dtype checks; these ops return nothing)
//   CUDA  : the adapter here when VLLM_V100_ADAPTER, else the native kernels
//           (csrc/cuda_bindings.cpp, under #ifndef VLLM_V100_ADAPTER)
// The paged-attention, rotary-embedding, sampling and gemv ops have CUDA kernels only (Volta-safe,
// registered in every CUDA build by csrc/cuda_bindings.cpp) plus Meta.
// `_C_adapter` exposes the same adapter functions under their own namespace so a
// native build can benchmark/test the adapter on a GPU beside the native kernels.
#include "attention_checks.h"
#include "awq_checks.h"
#include "w4_checks.h"
#include "fp8_checks.h"
#include "gdn_checks.h"
#include "gemv_checks.h"
#include "gguf_checks.h"
#include "moe_checks.h"
#include "moe_w4_checks.h"
#include "ops.h"
#include "rotary_checks.h"
#include "sampling_checks.h"
#include "staging_checks.h"

#include <torch/csrc/stable/library.h>

namespace vllm_volta {

void meta_rms_norm(Tensor result, Tensor input, Tensor weight, double epsilon) {
  check_norm_args("rms_norm", "result", result, "input", input, weight, epsilon);
}
void meta_fused_add_rms_norm(Tensor input, Tensor residual, Tensor weight, double epsilon) {
  check_norm_args("fused_add_rms_norm", "residual", residual, "input", input, weight, epsilon);
}
void meta_silu_and_mul(Tensor result, Tensor input) {
  check_act_and_mul_args("silu_and_mul", "result", result, input);
}
void meta_gelu_and_mul(Tensor out, Tensor input) {
  check_act_and_mul_args("gelu_and_mul", "out", out, input);
}
void meta_gelu_tanh_and_mul(Tensor out, Tensor input) {
  check_act_and_mul_args("gelu_tanh_and_mul", "out", out, input);
}

void meta_reshape_and_cache(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping, double k_scale,
                            double v_scale) {
  check_reshape_and_cache_args(key, value, kv_cache, slot_mapping, "reshape_and_cache", /*allow_fp8=*/true);
  check_kv_scales("reshape_and_cache", k_scale, v_scale);
}
void meta_paged_attention_decode(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                                 double scale, int64_t max_seq_len, int64_t partition_size, int64_t num_threads,
                                 int64_t sliding_window, double logits_soft_cap, double k_scale, double v_scale) {
  check_paged_decode_args(out, query, kv_cache, block_table, seq_lens, scale, max_seq_len, partition_size,
                          num_threads, sliding_window, logits_soft_cap, k_scale, v_scale);
}

void meta_rotary_embedding(Tensor positions, Tensor query, std::optional<Tensor> key, int64_t head_size,
                           Tensor cos_sin_cache, bool is_neox) {
  (void)is_neox;
  check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache);
}
void meta_rotary_embedding_and_cache(Tensor positions, Tensor query, Tensor key, Tensor value, Tensor kv_cache,
                                     Tensor slot_mapping, int64_t head_size, Tensor cos_sin_cache, bool is_neox) {
  (void)is_neox;
  check_rotary_embedding_and_cache_args(positions, query, key, value, kv_cache, slot_mapping, head_size,
                                        cos_sin_cache);
}

void meta_gumbel_sample(Tensor sampled, Tensor logits, Tensor temperature, Tensor seeds, Tensor workspace,
                        int64_t seed_offset, std::optional<Tensor> sampled_host) {
  (void)seed_offset;
  check_gumbel_sample_args(sampled, logits, temperature, seeds, workspace, sampled_host);
}
void meta_greedy_sample(Tensor sampled, Tensor logits, Tensor workspace, std::optional<Tensor> sampled_host) {
  check_greedy_sample_args(sampled, logits, workspace, sampled_host);
}
void meta_stage_decode_inputs(Tensor token_table, Tensor seq_lens, Tensor block_table, Tensor src_token_table,
                              Tensor src_seq_lens, Tensor src_block_table, std::optional<Tensor> input_ids) {
  check_stage_decode_inputs_args(token_table, seq_lens, block_table, src_token_table, src_seq_lens, src_block_table,
                                 input_ids);
}

void meta_gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
               std::optional<Tensor> norm_weight, double epsilon) {
  check_gemv_args("gemv", out, input, weight, bias, rows_per_block, /*gated=*/false, norm_weight, epsilon);
}
void meta_gemv_silu_and_mul(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias,
                            int64_t rows_per_block, std::optional<Tensor> norm_weight, double epsilon) {
  check_gemv_args("gemv_silu_and_mul", out, input, weight, bias, rows_per_block, /*gated=*/true, norm_weight,
                  epsilon);
}
void meta_gemv_rope_cache(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, Tensor positions,
                          Tensor kv_cache, Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox,
                          std::optional<Tensor> norm_weight, double epsilon) {
  check_gemv_rope_args(out, input, weight, bias, positions, kv_cache, slot_mapping, cos_sin_cache, norm_weight,
                       epsilon);
}
void meta_awq_dequantize(Tensor out, Tensor qweight, Tensor qzeros, Tensor scales) {
  check_awq_dequantize_args(out, qweight, qzeros, scales);
}
void meta_awq_gemv(Tensor out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales) {
  check_awq_gemv_args(out, input, qweight, qzeros, scales);
}
void meta_w4_dequantize(Tensor out, Tensor qweight, Tensor sz) { check_w4_dequantize_args(out, qweight, sz); }
void meta_w4_gemv(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t rows_per_warp) {
  check_w4_gemv_args(out, input, qweight, sz, rows_per_warp);
}
void meta_w4_gemm(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t block_m, int64_t block_n,
                  int64_t splits) {
  check_w4_gemm_args(out, input, qweight, sz, block_m, block_n, splits);
}
void meta_fp8_gemv(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k,
                   std::optional<Tensor> bias, int64_t rows_per_block) {
  check_fp8_gemv_args(out, input, weight, scales, group_k, bias, rows_per_block);
}
void meta_fp8_dequantize(Tensor out, Tensor weight, Tensor scales, int64_t group_k) {
  check_fp8_dequantize_args(out, weight, scales, group_k);
}
void meta_fp8_gemm(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k,
                   std::optional<Tensor> bias, int64_t split_k) {
  check_fp8_gemm_args(out, input, weight, scales, group_k, bias, split_k);
}
void meta_gguf_gemv(Tensor out, Tensor input, Tensor weight, int64_t qtype, std::optional<Tensor> bias) {
  check_gguf_gemv_args(out, input, weight, qtype, bias);
}
void meta_gguf_dequantize(Tensor out, Tensor weight, int64_t qtype) { check_gguf_dequantize_args(out, weight, qtype); }
void meta_topk_softmax(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output) {
  check_topk_args("topk_softmax", topk_weights, topk_ids, token_expert_indices, gating_output);
}
void meta_topk_sigmoid(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output) {
  check_topk_args("topk_sigmoid", topk_weights, topk_ids, token_expert_indices, gating_output);
}
void meta_moe_align_block_size(Tensor topk_ids, int64_t num_experts, int64_t block_size, Tensor sorted_token_ids,
                               Tensor experts_ids, Tensor num_tokens_post_pad) {
  check_moe_align_args(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad);
}
void meta_moe_sum(Tensor input, Tensor output) { check_moe_sum_args(input, output); }
void meta_moe_gemv_silu_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block) {
  check_moe_gemv_args("moe_gemv_silu_and_mul", out, input, w13, topk_ids, std::nullopt, rows_per_block, true);
}
void meta_moe_gemv_gelu_tanh_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block) {
  check_moe_gemv_args("moe_gemv_gelu_tanh_and_mul", out, input, w13, topk_ids, std::nullopt, rows_per_block, true);
}
void meta_moe_gemv_down_sum(Tensor out, Tensor input, Tensor w2, Tensor topk_ids, Tensor topk_weights,
                            int64_t rows_per_block) {
  check_moe_gemv_args("moe_gemv_down_sum", out, input, w2, topk_ids, topk_weights, rows_per_block, false);
}
void meta_moe_grouped_gemm(Tensor out, Tensor input, Tensor weight, Tensor sorted_token_ids, Tensor experts_ids,
                           Tensor num_tokens_post_pad, std::optional<Tensor> topk_weights, int64_t top_k,
                           int64_t block_size) {
  check_moe_gemm_args(out, input, weight, sorted_token_ids, experts_ids, num_tokens_post_pad, topk_weights, top_k,
                      block_size);
}
void meta_moe_w4_gemv_act_and_mul(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                                  int64_t activation) {
  check_moe_w4_gemv_args("moe_w4_gemv_act_and_mul", out, input, qweight, sz, topk_ids, std::nullopt, true);
  check_moe_w4_activation("moe_w4_gemv_act_and_mul", activation);
}
void meta_moe_w4_gemv_down_sum(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                               Tensor topk_weights) {
  check_moe_w4_gemv_args("moe_w4_gemv_down_sum", out, input, qweight, sz, topk_ids, topk_weights, false);
}
void meta_moe_w4_dequantize(Tensor out, Tensor qweight, Tensor sz, Tensor experts) {
  check_moe_w4_dequantize_args(out, qweight, sz, experts);
}
void meta_gemv_add(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block) {
  check_gemv_args("gemv_add", out, input, weight, bias, rows_per_block, /*gated=*/false);
}
void meta_gated_delta_rule_decode(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                                  Tensor state_slots, double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                                  std::optional<Tensor> dt_bias, int64_t col_threads) {
  (void)qk_l2norm;
  (void)col_threads;
  check_gated_delta_rule_args("gated_delta_rule_decode", out, q, k, v, a, b, state, state_slots, std::nullopt,
                              std::nullopt, scale, A_log, dt_bias);
}
void meta_gated_delta_rule_prefill(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                                   Tensor state_slots, Tensor query_start_loc, std::optional<Tensor> has_initial_state,
                                   double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                                   std::optional<Tensor> dt_bias, int64_t col_threads) {
  (void)qk_l2norm;
  (void)col_threads;
  check_gated_delta_rule_args("gated_delta_rule_prefill", out, q, k, v, a, b, state, state_slots, query_start_loc,
                              has_initial_state, scale, A_log, dt_bias);
}
void meta_causal_conv1d_update(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                               Tensor state_slots, bool silu) {
  (void)silu;
  check_causal_conv1d_args("causal_conv1d_update", out, x, weight, bias, conv_state, state_slots, std::nullopt,
                           std::nullopt);
}
void meta_causal_conv1d_fn(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                           Tensor query_start_loc, Tensor state_slots, std::optional<Tensor> has_initial_state,
                           bool silu) {
  (void)silu;
  check_causal_conv1d_args("causal_conv1d_fn", out, x, weight, bias, conv_state, state_slots, query_start_loc,
                           has_initial_state);
}
void meta_gated_rms_norm(Tensor out, Tensor x, Tensor gate, Tensor weight, double epsilon) {
  check_gated_rms_norm_args(out, x, gate, weight, epsilon);
}

}  // namespace vllm_volta

using namespace vllm_volta;

#define VLLM_VOLTA_DEFINE_NORM_ACT_SCHEMAS(m)                                                  \
  m.def("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()");        \
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()"); \
  m.def("silu_and_mul(Tensor! result, Tensor input) -> ()");                                  \
  m.def("gelu_and_mul(Tensor! out, Tensor input) -> ()");                                     \
  m.def("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()")

#define VLLM_VOLTA_IMPL_ADAPTER(m)                                         \
  m.impl("rms_norm", TORCH_BOX(&adapter_rms_norm));                        \
  m.impl("fused_add_rms_norm", TORCH_BOX(&adapter_fused_add_rms_norm));    \
  m.impl("silu_and_mul", TORCH_BOX(&adapter_silu_and_mul));                \
  m.impl("gelu_and_mul", TORCH_BOX(&adapter_gelu_and_mul));                \
  m.impl("gelu_tanh_and_mul", TORCH_BOX(&adapter_gelu_tanh_and_mul))

STABLE_TORCH_LIBRARY(_C, m) {
  VLLM_VOLTA_DEFINE_NORM_ACT_SCHEMAS(m);
  // Paged KV cache [2, num_blocks, block_size, num_kv_heads, head_size] (docs/ARCHITECTURE.md).
  // An FP8 cache (float8_e4m3fn / float8_e5m2) holds x / k_scale, x / v_scale (1.0: other caches).
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor! kv_cache, Tensor slot_mapping, float k_scale=1.0, "
        "float v_scale=1.0) -> ()");
  m.def("paged_attention_decode(Tensor! out, Tensor query, Tensor kv_cache, Tensor block_table, "
        "Tensor seq_lens, float scale, int max_seq_len, int partition_size=512, int num_threads=128, "
        "int sliding_window=0, float logits_soft_cap=0.0, float k_scale=1.0, float v_scale=1.0) -> ()");
  // In place on query/key ([T, H*D] or [T, H, D], rows may be strided); cos_sin_cache [max_pos, rot_dim].
  m.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox) -> ()");
  // rotary_embedding on query/key, then reshape_and_cache of the rotated key and value, in one kernel.
  m.def("rotary_embedding_and_cache(Tensor positions, Tensor! query, Tensor! key, Tensor value, Tensor! kv_cache, "
        "Tensor slot_mapping, int head_size, Tensor cos_sin_cache, bool is_neox) -> ()");
  // sampled[i] ~ softmax(logits[i] / temperature[i]), from a Philox stream keyed by seeds[i] at
  // counter offset seed_offset; workspace: >= 2 int64 zeros per row, zero again after the call;
  // sampled_host: pinned host memory that receives the ids too (no copy launch needed).
  m.def("gumbel_sample(Tensor! sampled, Tensor logits, Tensor temperature, Tensor seeds, Tensor! workspace, "
        "int seed_offset=0, Tensor!? sampled_host=None) -> ()");
  // sampled[i] = argmax(logits[i]) (the lowest index among equal maxima; NaN never wins).
  m.def("greedy_sample(Tensor! sampled, Tensor logits, Tensor! workspace, Tensor!? sampled_host=None) -> ()");
  // A decode step's B rows into the static buffers [.., N] of a CUDA graph: token_table[:, :B],
  // seq_lens[:B], block_table[:B, :W] from their sources; input_ids (optional) replace the ids.
  m.def("stage_decode_inputs(Tensor! token_table, Tensor! seq_lens, Tensor! block_table, Tensor src_token_table, "
        "Tensor src_seq_lens, Tensor src_block_table, Tensor? input_ids=None) -> ()");
  // out [M, N] = input [M, K] @ weight [N, K]^T (+ bias): float16 decode GEMV for 1 <= M <= 4;
  // with norm_weight, of rms_norm(input, norm_weight, epsilon) instead of input (a pre-norm).
  m.def("gemv(Tensor! out, Tensor input, Tensor weight, Tensor? bias, int rows_per_block=0, "
        "Tensor? norm_weight=None, float epsilon=0.0) -> ()");
  // out [M, N] = silu(input @ weight[:N]^T) * (input @ weight[N:]^T), weight [2N, K] = [gate; up]
  // (+ bias [2N]): an MLP's gate_up projection and its activation in one decode GEMV (the
  // input optionally RMS-normalized first, as in gemv).
  m.def("gemv_silu_and_mul(Tensor! out, Tensor input, Tensor weight, Tensor? bias, int rows_per_block=0, "
        "Tensor? norm_weight=None, float epsilon=0.0) -> ()");
  // out [M, N] += input @ weight^T (+ bias), the product rounded first: a projection added
  // into the residual stream (what gemv, then fused_add_rms_norm's add, computes).
  m.def("gemv_add(Tensor! out, Tensor input, Tensor weight, Tensor? bias, int rows_per_block=0) -> ()");
  // An attention layer's qkv projection at decode: gemv (with the optional norm prologue), then
  // rotary_embedding_and_cache on its q | k | v rows (full rotation), in one kernel.
  m.def("gemv_rope_cache(Tensor! out, Tensor input, Tensor weight, Tensor? bias, Tensor positions, "
        "Tensor! kv_cache, Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox, Tensor? norm_weight=None, "
        "float epsilon=0.0) -> ()");
  // AWQ 4-bit weights (qweight int32 [K, N/8], qzeros int32 [K/g, N/8], scales float16 [K/g, N]):
  // out [K, N] = the float16 weight; out [M, N] = input [M, K] @ that weight for 1 <= M <= 4.
  m.def("awq_dequantize(Tensor! out, Tensor qweight, Tensor qzeros, Tensor scales) -> ()");
  m.def("awq_gemv(Tensor! out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales) -> ()");
  m.def("w4_dequantize(Tensor! out, Tensor qweight, Tensor sz) -> ()");
  m.def("w4_gemv(Tensor! out, Tensor input, Tensor qweight, Tensor sz, int rows_per_warp) -> ()");
  m.def("w4_gemm(Tensor! out, Tensor input, Tensor qweight, Tensor sz, int block_m, int block_n, int splits) -> ()");
  // FP8 e4m3fn weights [N, K] with float32 scales [N, G] (one per row and group_k inputs, or G = 1):
  // out [M, N] = input [M, K] @ W^T (+ bias) for 1 <= M <= 8; out [N, K] = W. float16 (bfloat16 on SM80+).
  m.def("fp8_gemv(Tensor! out, Tensor input, Tensor weight, Tensor scales, int group_k, Tensor? bias=None, "
        "int rows_per_block=0) -> ()");
  m.def("fp8_dequantize(Tensor! out, Tensor weight, Tensor scales, int group_k) -> ()");
  // The same product for any M on tensor cores (16-bit MMAs, FP32 accumulation); split_k 0: automatic.
  m.def("fp8_gemm(Tensor! out, Tensor input, Tensor weight, Tensor scales, int group_k, Tensor? bias=None, "
        "int split_k=0) -> ()");
  // GGUF blocks uint8 [N, row_bytes] of GGML type `qtype` (Q4_0 2, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14):
  // out [M, N] = input [M, K] @ W^T (+ bias) for 1 <= M <= 8, float16; out [N, K] = W in float16.
  m.def("gguf_gemv(Tensor! out, Tensor input, Tensor weight, int qtype, Tensor? bias=None) -> ()");
  m.def("gguf_dequantize(Tensor! out, Tensor weight, int qtype) -> ()");
  // Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention), states addressed by slot
  // (docs/ARCHITECTURE.md): q, k [N, Hk, Dk], v / out [N, Hv, Dv], a / b [N, Hv] (g and beta, or
  // with A_log and dt_bias the raw projections), state [num_slots, Hv, Dk, Dv], state_slots [B].
  m.def("gated_delta_rule_decode(Tensor! out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor! state, "
        "Tensor state_slots, float scale, bool qk_l2norm, Tensor? A_log=None, Tensor? dt_bias=None, "
        "int col_threads=0) -> ()");
  m.def("gated_delta_rule_prefill(Tensor! out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor! state, "
        "Tensor state_slots, Tensor query_start_loc, Tensor? has_initial_state, float scale, bool qk_l2norm, "
        "Tensor? A_log=None, Tensor? dt_bias=None, int col_threads=0) -> ()");
  // Causal depthwise conv1d (+ SiLU): x / out [N, C], weight [C, W], conv_state [num_slots, C, W - 1].
  m.def("causal_conv1d_update(Tensor! out, Tensor x, Tensor weight, Tensor? bias, Tensor! conv_state, "
        "Tensor state_slots, bool silu) -> ()");
  m.def("causal_conv1d_fn(Tensor! out, Tensor x, Tensor weight, Tensor? bias, Tensor! conv_state, "
        "Tensor query_start_loc, Tensor state_slots, Tensor? has_initial_state, bool silu) -> ()");
  // Gated RMSNorm before out_proj: x / gate / out [N, heads * dim], each head's dim entries
  // normalized (weight [dim]) and multiplied by silu(gate).
  m.def("gated_rms_norm(Tensor! out, Tensor x, Tensor gate, Tensor weight, float epsilon) -> ()");
  // Mixture of experts (vLLM's schemas where vLLM has the op). Routing: each token's top_k experts
  // by softmax (sigmoid) score of gating_output [T, E]: weights float32, ids int32, largest first.
  m.def("topk_softmax(Tensor! topk_weights, Tensor! topk_ids, Tensor! token_expert_indices, "
        "Tensor gating_output) -> ()");
  m.def("topk_sigmoid(Tensor! topk_weights, Tensor! topk_ids, Tensor! token_expert_indices, "
        "Tensor gating_output) -> ()");
  // The (token, expert) pairs sorted by expert, each expert padded to a multiple of block_size.
  m.def("moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, Tensor! sorted_token_ids, "
        "Tensor! experts_ids, Tensor! num_tokens_post_pad) -> ()");
  m.def("moe_sum(Tensor input, Tensor! output) -> ()");
  // Decode: out [T, k, I] = silu(gate) * up of each token's chosen experts (w13 [E, 2I, H]);
  // out [T, H] = sum_j topk_weights[t, j] * input[t, j] @ w2[e]^T (w2 [E, H, I]).
  m.def("moe_gemv_silu_and_mul(Tensor! out, Tensor input, Tensor w13, Tensor topk_ids, "
        "int rows_per_block=0) -> ()");
  m.def("moe_gemv_gelu_tanh_and_mul(Tensor! out, Tensor input, Tensor w13, Tensor topk_ids, "
        "int rows_per_block=0) -> ()");
  m.def("moe_gemv_down_sum(Tensor! out, Tensor input, Tensor w2, Tensor topk_ids, Tensor topk_weights, "
        "int rows_per_block=0) -> ()");
  // Prefill: out [P, N] rows p = input[p / top_k] @ weight[e]^T (x topk_weights[p]) over sorted blocks.
  m.def("moe_grouped_gemm(Tensor! out, Tensor input, Tensor weight, Tensor sorted_token_ids, "
        "Tensor experts_ids, Tensor num_tokens_post_pad, Tensor? topk_weights, int top_k, int block_size) -> ()");
  // 4-bit experts (qweight int32 [E, N, K/8] K-major, sz float16 [E, N, G, 2]): decode GEMVs over
  // the chosen experts (activation 0 silu, 1 gelu_tanh) and the listed experts dequantized.
  m.def("moe_w4_gemv_act_and_mul(Tensor! out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids, "
        "int activation) -> ()");
  m.def("moe_w4_gemv_down_sum(Tensor! out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids, "
        "Tensor topk_weights) -> ()");
  m.def("moe_w4_dequantize(Tensor! out, Tensor qweight, Tensor sz, Tensor experts) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(_C, CPU, m) {
  VLLM_VOLTA_IMPL_ADAPTER(m);
}

STABLE_TORCH_LIBRARY_IMPL(_C, Meta, m) {
  m.impl("rms_norm", TORCH_BOX(&meta_rms_norm));
  m.impl("fused_add_rms_norm", TORCH_BOX(&meta_fused_add_rms_norm));
  m.impl("silu_and_mul", TORCH_BOX(&meta_silu_and_mul));
  m.impl("gelu_and_mul", TORCH_BOX(&meta_gelu_and_mul));
  m.impl("gelu_tanh_and_mul", TORCH_BOX(&meta_gelu_tanh_and_mul));
  m.impl("reshape_and_cache", TORCH_BOX(&meta_reshape_and_cache));
  m.impl("paged_attention_decode", TORCH_BOX(&meta_paged_attention_decode));
  m.impl("rotary_embedding", TORCH_BOX(&meta_rotary_embedding));
  m.impl("rotary_embedding_and_cache", TORCH_BOX(&meta_rotary_embedding_and_cache));
  m.impl("gumbel_sample", TORCH_BOX(&meta_gumbel_sample));
  m.impl("greedy_sample", TORCH_BOX(&meta_greedy_sample));
  m.impl("stage_decode_inputs", TORCH_BOX(&meta_stage_decode_inputs));
  m.impl("gemv", TORCH_BOX(&meta_gemv));
  m.impl("gemv_silu_and_mul", TORCH_BOX(&meta_gemv_silu_and_mul));
  m.impl("gemv_add", TORCH_BOX(&meta_gemv_add));
  m.impl("gemv_rope_cache", TORCH_BOX(&meta_gemv_rope_cache));
  m.impl("awq_dequantize", TORCH_BOX(&meta_awq_dequantize));
  m.impl("awq_gemv", TORCH_BOX(&meta_awq_gemv));
  m.impl("w4_dequantize", TORCH_BOX(&meta_w4_dequantize));
  m.impl("w4_gemv", TORCH_BOX(&meta_w4_gemv));
  m.impl("w4_gemm", TORCH_BOX(&meta_w4_gemm));
  m.impl("fp8_gemv", TORCH_BOX(&meta_fp8_gemv));
  m.impl("fp8_dequantize", TORCH_BOX(&meta_fp8_dequantize));
  m.impl("fp8_gemm", TORCH_BOX(&meta_fp8_gemm));
  m.impl("gguf_gemv", TORCH_BOX(&meta_gguf_gemv));
  m.impl("gguf_dequantize", TORCH_BOX(&meta_gguf_dequantize));
  m.impl("gated_delta_rule_decode", TORCH_BOX(&meta_gated_delta_rule_decode));
  m.impl("gated_delta_rule_prefill", TORCH_BOX(&meta_gated_delta_rule_prefill));
  m.impl("causal_conv1d_update", TORCH_BOX(&meta_causal_conv1d_update));
  m.impl("causal_conv1d_fn", TORCH_BOX(&meta_causal_conv1d_fn));
  m.impl("gated_rms_norm", TORCH_BOX(&meta_gated_rms_norm));
  m.impl("topk_softmax", TORCH_BOX(&meta_topk_softmax));
  m.impl("topk_sigmoid", TORCH_BOX(&meta_topk_sigmoid));
  m.impl("moe_align_block_size", TORCH_BOX(&meta_moe_align_block_size));
  m.impl("moe_sum", TORCH_BOX(&meta_moe_sum));
  m.impl("moe_gemv_silu_and_mul", TORCH_BOX(&meta_moe_gemv_silu_and_mul));
  m.impl("moe_gemv_gelu_tanh_and_mul", TORCH_BOX(&meta_moe_gemv_gelu_tanh_and_mul));
  m.impl("moe_gemv_down_sum", TORCH_BOX(&meta_moe_gemv_down_sum));
  m.impl("moe_grouped_gemm", TORCH_BOX(&meta_moe_grouped_gemm));
  m.impl("moe_w4_gemv_act_and_mul", TORCH_BOX(&meta_moe_w4_gemv_act_and_mul));
  m.impl("moe_w4_gemv_down_sum", TORCH_BOX(&meta_moe_w4_gemv_down_sum));
  m.impl("moe_w4_dequantize", TORCH_BOX(&meta_moe_w4_dequantize));
}

#if defined(USE_CUDA) && defined(VLLM_V100_ADAPTER)
STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  VLLM_VOLTA_IMPL_ADAPTER(m);
}
#endif

STABLE_TORCH_LIBRARY(_C_adapter, m) {
  VLLM_VOLTA_DEFINE_NORM_ACT_SCHEMAS(m);
}

STABLE_TORCH_LIBRARY_IMPL(_C_adapter, CPU, m) {
  VLLM_VOLTA_IMPL_ADAPTER(m);
}

#ifdef USE_CUDA
STABLE_TORCH_LIBRARY_IMPL(_C_adapter, CUDA, m) {
  VLLM_VOLTA_IMPL_ADAPTER(m);
}
#endif
