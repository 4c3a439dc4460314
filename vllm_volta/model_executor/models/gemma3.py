"""Gemma 3, text only (``Gemma3ForCausalLM``, model_type gemma3_text: Gemma 3 1B and text-only
checkpoints): Gemma 2 (gemma2.py) with

- an RMSNorm (1 + weight) over each query / key head before RoPE, as Qwen3's;
- two RoPE tables: the sliding layers' (rope_theta 10k) and the full layers' (1M, linear scaling
  in the larger models), from ``rope_parameters`` keyed by layer type (transformers 5) or
  ``rope_local_base_freq`` beside ``rope_theta`` / ``rope_scaling`` (before);
- five sliding-window layers to one full one; soft caps only where the config sets them.
"""

from __future__ import annotations

from typing import Any

from vllm_volta.model_executor.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma3ForCausalLM; extra weights ``self_attn.q_norm`` / ``self_attn.k_norm`` per layer."""

    sliding_window_pattern = 6

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, Any]:
        return {**super().attention_options(config), "qk_norm": True}
