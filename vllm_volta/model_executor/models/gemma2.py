"""Gemma 2: Gemma (gemma.py: GeGLU, 1 + weight norms, scaled embeddings, tied head) with

- four RMSNorms per layer: after the attention and after the MLP too, each normalising the
  block's output before it is added to the residual stream (``Gemma2DecoderLayer``);
- attention scale ``query_pre_attn_scalar ** -0.5`` and attention-logit soft-capping
  (``attn_logit_softcapping``); the final logits are soft-capped too (``final_logit_softcapping``,
  LogitsProcessor's soft_cap);
- sliding-window attention in the "sliding_attention" layers of ``config.layer_types`` (every
  other layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.models.gemma import GemmaForCausalLM
from vllm_volta.model_executor.models.llama import LlamaAttention, LlamaMLP, SlidingWindowSpecs
from vllm_volta.model_executor.models.utils import config_head_dim


class Gemma2DecoderLayer(nn.Module):
    """``h = x + post_attention_norm(attn(input_norm(x)))``, then
    ``h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))``.

    As LlamaDecoderLayer it takes and returns ``(hidden_states, residual)``, their sum being the
    residual stream (``residual`` None: ``hidden_states`` is it): the fused add + norm kernels add
    each block's normalised output into the residual.
    """

    def __init__(self, config: Any, attn_backend: type | None, rotary_emb: nn.Module, layer_idx: int,
                 attention_options: dict[str, Any]) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, attn_backend, rotary_emb, layer_idx, **attention_options)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_activation)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        attn_out = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.pre_feedforward_layernorm(
            self.post_attention_layernorm(attn_out), residual)
        return self.post_feedforward_layernorm(self.mlp(hidden_states)), residual


class Gemma2ForCausalLM(SlidingWindowSpecs, GemmaForCausalLM):
    """Gemma2ForCausalLM; HF weight names are Llama's plus the two feed-forward norms. Its
    sliding layers' caches keep only their window (``kv_cache_specs``)."""

    decoder_layer_cls = Gemma2DecoderLayer
    # Every n-th layer has full attention, the others a sliding window, where the config has no
    # layer_types (transformers before 4.53 did not fill it): n is its sliding_window_pattern or this.
    sliding_window_pattern = 2

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, Any]:
        scalar = getattr(config, "query_pre_attn_scalar", None) or config_head_dim(config)
        return {**super().attention_options(config), "scale": scalar ** -0.5,
                "logits_soft_cap": getattr(config, "attn_logit_softcapping", None)}

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None
                 ) -> None:
        if not getattr(hf_config, "layer_types", None):
            n = getattr(hf_config, "sliding_window_pattern", None) or self.sliding_window_pattern
            hf_config.layer_types = ["sliding_attention" if (i + 1) % n else "full_attention"
                                     for i in range(hf_config.num_hidden_layers)]
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend)
