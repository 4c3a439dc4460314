// CUDA registrations of the native kernels. Compiled only in CUDA builds; the norm and
// activation kernels are replaced by the V100 adapter when every target arch is below
// SM80 (VLLM_V100_ADAPTER, see csrc/torch_bindings.cpp), so each (op, CUDA) has exactly
// one kernel. The paged-attention, rotary-embedding, sampling and gemv kernels are Volta-safe
// and registered in every build.
#include "ops.h"

#include <torch/csrc/stable/library.h>

using namespace vllm_volta;

#ifndef VLLM_V100_ADAPTER
STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("rms_norm", TORCH_BOX(&native_rms_norm));
  m.impl("fused_add_rms_norm", TORCH_BOX(&native_fused_add_rms_norm));
  m.impl("silu_and_mul", TORCH_BOX(&native_silu_and_mul));
  m.impl("gelu_and_mul", TORCH_BOX(&native_gelu_and_mul));
  m.impl("gelu_tanh_and_mul", TORCH_BOX(&native_gelu_tanh_and_mul));
}
#endif

STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("reshape_and_cache", TORCH_BOX(&reshape_and_cache));
  m.impl("paged_attention_decode", TORCH_BOX(&paged_attention_decode));
  m.impl("rotary_embedding", TORCH_BOX(&rotary_embedding));
  m.impl("rotary_embedding_and_cache", TORCH_BOX(&rotary_embedding_and_cache));
  m.impl("gumbel_sample", TORCH_BOX(&gumbel_sample));
  m.impl("greedy_sample", TORCH_BOX(&greedy_sample));
  m.impl("stage_decode_inputs", TORCH_BOX(&stage_decode_inputs));
  m.impl("gemv", TORCH_BOX(&gemv));
  m.impl("gemv_silu_and_mul", TORCH_BOX(&gemv_silu_and_mul));
  m.impl("gemv_add", TORCH_BOX(&gemv_add));
  m.impl("gemv_rope_cache", TORCH_BOX(&gemv_rope_cache));
  m.impl("awq_dequantize", TORCH_BOX(&awq_dequantize));
  m.impl("awq_gemv", TORCH_BOX(&awq_gemv));
  m.impl("w4_dequantize", TORCH_BOX(&w4_dequantize));
  m.impl("w4_gemv", TORCH_BOX(&w4_gemv));
  m.impl("w4_gemm", TORCH_BOX(&w4_gemm));
  m.impl("fp8_gemv", TORCH_BOX(&fp8_gemv));
  m.impl("fp8_dequantize", TORCH_BOX(&fp8_dequantize));
  m.impl("fp8_gemm", TORCH_BOX(&fp8_gemm));
  m.impl("gguf_gemv", TORCH_BOX(&gguf_gemv));
  m.impl("gguf_dequantize", TORCH_BOX(&gguf_dequantize));
  m.impl("gated_delta_rule_decode", TORCH_BOX(&gated_delta_rule_decode));
  m.impl("gated_delta_rule_prefill", TORCH_BOX(&gated_delta_rule_prefill));
  m.impl("causal_conv1d_update", TORCH_BOX(&causal_conv1d_update));
  m.impl("causal_conv1d_fn", TORCH_BOX(&causal_conv1d_fn));
  m.impl("gated_rms_norm", TORCH_BOX(&gated_rms_norm));
  m.impl("topk_softmax", TORCH_BOX(&topk_softmax));
  m.impl("topk_sigmoid", TORCH_BOX(&topk_sigmoid));
  m.impl("moe_align_block_size", TORCH_BOX(&moe_align_block_size));
  m.impl("moe_sum", TORCH_BOX(&moe_sum));
  m.impl("moe_gemv_silu_and_mul", TORCH_BOX(&moe_gemv_silu_and_mul));
  m.impl("moe_gemv_gelu_tanh_and_mul", TORCH_BOX(&moe_gemv_gelu_tanh_and_mul));
  m.impl("moe_gemv_down_sum", TORCH_BOX(&moe_gemv_down_sum));
  m.impl("moe_grouped_gemm", TORCH_BOX(&moe_grouped_gemm));
  m.impl("moe_w4_gemv_act_and_mul", TORCH_BOX(&moe_w4_gemv_act_and_mul));
  m.impl("moe_w4_gemv_down_sum", TORCH_BOX(&moe_w4_gemv_down_sum));
  m.impl("moe_w4_dequantize", TORCH_BOX(&moe_w4_dequantize));
}
