"""Qwen3: the Llama decoder with an RMSNorm over each query/key head before RoPE."""

from __future__ import annotations

from typing import Any

from vllm_volta.model_executor.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3ForCausalLM; extra weights ``self_attn.q_norm`` / ``self_attn.k_norm`` per layer."""

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, bool]:
        bias = bool(getattr(config, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True}
