"""Phi-3 / Phi-4 (``Phi3ForCausalLM``): the Llama decoder, with q/k/v and gate/up stored fused in
the checkpoint (``qkv_proj``, ``gate_up_proj``: the fused layers load them whole). LongRoPE scaling
(the 128k variants) and partial rotary embeddings (Phi-4-mini) are not supported."""

from __future__ import annotations

from typing import Any

import torch

from vllm_volta.model_executor.models.llama import LlamaForCausalLM, SlidingWindowSpecs


class Phi3ForCausalLM(SlidingWindowSpecs, LlamaForCausalLM):
    """Phi-3: where the config sets a sliding window, its layers' caches keep only the window."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None) -> None:
        rope = getattr(hf_config, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None)) or 1.0
        if factor != 1.0:
            raise ValueError(f"partial_rotary_factor: {factor} is not supported (Phi-3 models with full "
                             "rotary embeddings, factor 1.0, are)")
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend)
