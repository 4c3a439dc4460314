"""Gemma (the first generation: Gemma 2B / 7B, CodeGemma): the Llama decoder with

- a gated GELU MLP (GeGLU, tanh approximation: ``hidden_act="gelu_pytorch_tanh"``);
- RMSNorms that scale by ``1 + weight``: the checkpoint's norm weights get their 1 added at load,
  so the Llama norm layers and kernels run unchanged;
- embeddings multiplied by sqrt(hidden_size), rounded to the model dtype as transformers does;
- the lm_head tied to the embeddings, and a head size given by the config (256).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from vllm_volta.model_executor.models.llama import LlamaForCausalLM


def _offset_norms(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Gemma's norm weights w -> 1 + w (in fp32: the checkpoint stores the offset alone). Every
    norm of Gemma 1-3 is named "...norm.weight" (input_layernorm, Gemma 2's
    pre_feedforward_layernorm, Gemma 3's q_norm, ...) and no other weight is."""
    for name, tensor in weights:
        yield name, (tensor.float() + 1.0) if name.endswith("norm.weight") else tensor


class GemmaForCausalLM(LlamaForCausalLM):
    """GemmaForCausalLM; HF weight names are Llama's. The base of Gemma 2 and 3 (gemma2.py)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None
                 ) -> None:
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend)
        self.model.embed_scale = torch.tensor(hf_config.hidden_size ** 0.5, dtype=dtype).item()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_offset_norms(weights))
