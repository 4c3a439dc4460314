"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q/k/v projections (none on o_proj)."""

from __future__ import annotations

from typing import Any

from vllm_volta.model_executor.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2ForCausalLM; HF weight names are the same as Llama's."""

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, bool]:
        return {"qkv_bias": True, "o_bias": False, "qk_norm": False}
