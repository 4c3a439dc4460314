// Host entry points of every op in the _C library. The adapter functions are
// device-agnostic (torch::stable ops) and double as the CPU kernels; the native_*
// functions launch our CUDA kernels.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

namespace vllm_volta {

using torch::stable::Tensor;

// ---- V100 adapter / CPU (csrc/v100_adapter/adapter_ops.cpp) ----
void adapter_rms_norm(Tensor result, Tensor input, Tensor weight, double epsilon);
void adapter_fused_add_rms_norm(Tensor input, Tensor residual, Tensor weight, double epsilon);
void adapter_silu_and_mul(Tensor result, Tensor input);
void adapter_gelu_and_mul(Tensor out, Tensor input);
void adapter_gelu_tanh_and_mul(Tensor out, Tensor input);

// ---- Meta: shape/dtype validation only (csrc/torch_bindings.cpp) ----
void meta_rms_norm(Tensor result, Tensor input, Tensor weight, double epsilon);
void meta_fused_add_rms_norm(Tensor input, Tensor residual, Tensor weight, double epsilon);
void meta_silu_and_mul(Tensor result, Tensor input);
void meta_gelu_and_mul(Tensor out, Tensor input);
void meta_gelu_tanh_and_mul(Tensor out, Tensor input);
void meta_reshape_and_cache(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping, double k_scale,
                            double v_scale);
void meta_paged_attention_decode(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                                 double scale, int64_t max_seq_len, int64_t partition_size, int64_t num_threads,
                                 int64_t sliding_window, double logits_soft_cap, double k_scale, double v_scale);
void meta_rotary_embedding(Tensor positions, Tensor query, std::optional<Tensor> key, int64_t head_size,
                           Tensor cos_sin_cache, bool is_neox);
void meta_rotary_embedding_and_cache(Tensor positions, Tensor query, Tensor key, Tensor value, Tensor kv_cache,
                                     Tensor slot_mapping, int64_t head_size, Tensor cos_sin_cache, bool is_neox);
void meta_gumbel_sample(Tensor sampled, Tensor logits, Tensor temperature, Tensor seeds, Tensor workspace,
                        int64_t seed_offset, std::optional<Tensor> sampled_host);
void meta_greedy_sample(Tensor sampled, Tensor logits, Tensor workspace, std::optional<Tensor> sampled_host);
void meta_stage_decode_inputs(Tensor token_table, Tensor seq_lens, Tensor block_table, Tensor src_token_table,
                              Tensor src_seq_lens, Tensor src_block_table, std::optional<Tensor> input_ids);
void meta_gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
               std::optional<Tensor> norm_weight, double epsilon);
void meta_gemv_silu_and_mul(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias,
                            int64_t rows_per_block, std::optional<Tensor> norm_weight, double epsilon);
void meta_gemv_add(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block);
void meta_gemv_rope_cache(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, Tensor positions,
                          Tensor kv_cache, Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox,
                          std::optional<Tensor> norm_weight, double epsilon);
void meta_awq_dequantize(Tensor out, Tensor qweight, Tensor qzeros, Tensor scales);
void meta_awq_gemv(Tensor out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales);
void meta_w4_dequantize(Tensor out, Tensor qweight, Tensor sz);
void meta_w4_gemv(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t rows_per_warp);
void meta_w4_gemm(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t block_m, int64_t block_n,
                  int64_t splits);
void meta_fp8_gemv(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k,
                   std::optional<Tensor> bias, int64_t rows_per_block);
void meta_fp8_dequantize(Tensor out, Tensor weight, Tensor scales, int64_t group_k);
void meta_fp8_gemm(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k,
                   std::optional<Tensor> bias, int64_t split_k);
void meta_gguf_gemv(Tensor out, Tensor input, Tensor weight, int64_t qtype, std::optional<Tensor> bias);
void meta_gguf_dequantize(Tensor out, Tensor weight, int64_t qtype);
void meta_topk_softmax(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output);
void meta_topk_sigmoid(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output);
void meta_moe_align_block_size(Tensor topk_ids, int64_t num_experts, int64_t block_size, Tensor sorted_token_ids,
                               Tensor experts_ids, Tensor num_tokens_post_pad);
void meta_moe_sum(Tensor input, Tensor output);
void meta_moe_gemv_silu_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block);
void meta_moe_gemv_gelu_tanh_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block);
void meta_moe_gemv_down_sum(Tensor out, Tensor input, Tensor w2, Tensor topk_ids, Tensor topk_weights,
                            int64_t rows_per_block);
void meta_moe_grouped_gemm(Tensor out, Tensor input, Tensor weight, Tensor sorted_token_ids, Tensor experts_ids,
                           Tensor num_tokens_post_pad, std::optional<Tensor> topk_weights, int64_t top_k,
                           int64_t block_size);
void meta_moe_w4_gemv_act_and_mul(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                                  int64_t activation);
void meta_moe_w4_gemv_down_sum(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                               Tensor topk_weights);
void meta_moe_w4_dequantize(Tensor out, Tensor qweight, Tensor sz, Tensor experts);
void meta_gated_delta_rule_decode(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                                  Tensor state_slots, double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                                  std::optional<Tensor> dt_bias, int64_t col_threads);
void meta_gated_delta_rule_prefill(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                                   Tensor state_slots, Tensor query_start_loc, std::optional<Tensor> has_initial_state,
                                   double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                                   std::optional<Tensor> dt_bias, int64_t col_threads);
void meta_causal_conv1d_update(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                               Tensor state_slots, bool silu);
void meta_causal_conv1d_fn(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                           Tensor query_start_loc, Tensor state_slots, std::optional<Tensor> has_initial_state,
                           bool silu);
void meta_gated_rms_norm(Tensor out, Tensor x, Tensor gate, Tensor weight, double epsilon);

#ifdef USE_CUDA
// ---- native CUDA kernels (csrc/*_kernels.cu) ----
void native_rms_norm(Tensor result, Tensor input, Tensor weight, double epsilon);
void native_fused_add_rms_norm(Tensor input, Tensor residual, Tensor weight, double epsilon);
void native_silu_and_mul(Tensor result, Tensor input);
void native_gelu_and_mul(Tensor out, Tensor input);
void native_gelu_tanh_and_mul(Tensor out, Tensor input);

// ---- paged KV cache + decode attention, Volta-safe, CUDA in every build ----
void reshape_and_cache(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping, double k_scale,
                       double v_scale);
void paged_attention_decode(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                            double scale, int64_t max_seq_len, int64_t partition_size, int64_t num_threads,
                            int64_t sliding_window, double logits_soft_cap, double k_scale, double v_scale);

// ---- rotary embedding, in place on query/key, Volta-safe, CUDA in every build (csrc/rotary_kernels.cu) ----
void rotary_embedding(Tensor positions, Tensor query, std::optional<Tensor> key, int64_t head_size,
                      Tensor cos_sin_cache, bool is_neox);
void rotary_embedding_and_cache(Tensor positions, Tensor query, Tensor key, Tensor value, Tensor kv_cache,
                                Tensor slot_mapping, int64_t head_size, Tensor cos_sin_cache, bool is_neox);

// ---- random (Gumbel-max) and greedy (argmax) sampling over the logits, Volta-safe, CUDA in every build (csrc/sampling_kernels.cu) ----
void gumbel_sample(Tensor sampled, Tensor logits, Tensor temperature, Tensor seeds, Tensor workspace,
                   int64_t seed_offset, std::optional<Tensor> sampled_host);
void greedy_sample(Tensor sampled, Tensor logits, Tensor workspace, std::optional<Tensor> sampled_host);

// ---- a decode step's inputs into its CUDA graph's static buffers, CUDA in every build (csrc/staging_kernels.cu) ----
void stage_decode_inputs(Tensor token_table, Tensor seq_lens, Tensor block_table, Tensor src_token_table,
                         Tensor src_seq_lens, Tensor src_block_table, std::optional<Tensor> input_ids);

// ---- decode GEMV (1-4 tokens), float16, Volta-safe, CUDA in every build (csrc/gemv_kernels.cu) ----
void gemv(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
          std::optional<Tensor> norm_weight, double epsilon);
void gemv_silu_and_mul(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block,
                       std::optional<Tensor> norm_weight, double epsilon);
void gemv_add(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, int64_t rows_per_block);
void gemv_rope_cache(Tensor out, Tensor input, Tensor weight, std::optional<Tensor> bias, Tensor positions,
                     Tensor kv_cache, Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox,
                     std::optional<Tensor> norm_weight, double epsilon);

// ---- AWQ 4-bit weights, float16, Volta-safe, CUDA in every build (csrc/awq_kernels.cu) ----
void awq_dequantize(Tensor out, Tensor qweight, Tensor qzeros, Tensor scales);
void awq_gemv(Tensor out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales);
// ---- W4A16 on the K-major 4-bit layout, float16, Volta-safe, CUDA in every build (csrc/w4_kernels.cu) ----
void w4_dequantize(Tensor out, Tensor qweight, Tensor sz);
void w4_gemv(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t rows_per_warp);
void w4_gemm(Tensor out, Tensor input, Tensor qweight, Tensor sz, int64_t block_m, int64_t block_n, int64_t splits);

// ---- FP8 e4m3fn weights converted in registers, float16, Volta-safe, CUDA in every build (csrc/fp8_kernels.cu) ----
void fp8_gemv(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k, std::optional<Tensor> bias,
              int64_t rows_per_block);
void fp8_dequantize(Tensor out, Tensor weight, Tensor scales, int64_t group_k);
void fp8_gemm(Tensor out, Tensor input, Tensor weight, Tensor scales, int64_t group_k, std::optional<Tensor> bias,
              int64_t split_k);

// ---- GGUF blocks (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) decoded in registers, float16, Volta-safe (csrc/gguf_kernels.cu) ----
void gguf_gemv(Tensor out, Tensor input, Tensor weight, int64_t qtype, std::optional<Tensor> bias);
void gguf_dequantize(Tensor out, Tensor weight, int64_t qtype);

// ---- mixture of experts: routing, expert order, decode GEMVs, grouped GEMM (csrc/moe_kernels.cu) ----
void topk_softmax(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output);
void topk_sigmoid(Tensor topk_weights, Tensor topk_ids, Tensor token_expert_indices, Tensor gating_output);
void moe_align_block_size(Tensor topk_ids, int64_t num_experts, int64_t block_size, Tensor sorted_token_ids,
                          Tensor experts_ids, Tensor num_tokens_post_pad);
void moe_sum(Tensor input, Tensor output);
void moe_gemv_silu_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block);
void moe_gemv_gelu_tanh_and_mul(Tensor out, Tensor input, Tensor w13, Tensor topk_ids, int64_t rows_per_block);
void moe_gemv_down_sum(Tensor out, Tensor input, Tensor w2, Tensor topk_ids, Tensor topk_weights,
                       int64_t rows_per_block);
void moe_grouped_gemm(Tensor out, Tensor input, Tensor weight, Tensor sorted_token_ids, Tensor experts_ids,
                      Tensor num_tokens_post_pad, std::optional<Tensor> topk_weights, int64_t top_k,
                      int64_t block_size);

// ---- 4-bit mixture of experts: decode GEMVs over the chosen experts, expert dequantization (csrc/moe_w4_kernels.cu) ----
void moe_w4_gemv_act_and_mul(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                             int64_t activation);
void moe_w4_gemv_down_sum(Tensor out, Tensor input, Tensor qweight, Tensor sz, Tensor topk_ids,
                          Tensor topk_weights);
void moe_w4_dequantize(Tensor out, Tensor qweight, Tensor sz, Tensor experts);

// ---- Gated DeltaNet recurrence and causal conv1d with per-slot states, Volta-safe, CUDA in every build (csrc/gdn_kernels.cu) ----
void gated_delta_rule_decode(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                             Tensor state_slots, double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                             std::optional<Tensor> dt_bias, int64_t col_threads);
void gated_delta_rule_prefill(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor state,
                              Tensor state_slots, Tensor query_start_loc, std::optional<Tensor> has_initial_state,
                              double scale, bool qk_l2norm, std::optional<Tensor> A_log,
                              std::optional<Tensor> dt_bias, int64_t col_threads);
void causal_conv1d_update(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                          Tensor state_slots, bool silu);
void causal_conv1d_fn(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                      Tensor query_start_loc, Tensor state_slots, std::optional<Tensor> has_initial_state, bool silu);
void gated_rms_norm(Tensor out, Tensor x, Tensor gate, Tensor weight, double epsilon);
#endif

}  // namespace vllm_volta
