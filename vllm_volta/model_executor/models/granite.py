"""IBM Granite 3.x (``GraniteForCausalLM``): the Llama decoder with four multipliers --
embeddings times ``embedding_multiplier``, attention scale ``attention_multiplier``, each block's
output times ``residual_multiplier`` before it joins the residual stream, logits divided by
``logits_scaling``. The residual multiplier is folded into o_proj's and down_proj's weights (and
biases, or AWQ scales) at load, so the fused decode paths run unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from vllm_volta.model_executor.models.llama import LlamaForCausalLM

_RESIDUAL_PROJECTIONS = ("self_attn.o_proj", "mlp.down_proj")


class GraniteForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: Any) -> dict[str, Any]:
        return {**super().attention_options(config), "scale": float(config.attention_multiplier)}

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None) -> None:
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend)
        self.model.embed_scale = float(hf_config.embedding_multiplier)
        self.logits_processor.scale = 1.0 / float(hf_config.logits_scaling)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        m = float(self.config.residual_multiplier)

        def scaled() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                module, _, kind = name.rpartition(".")
                if module.endswith(_RESIDUAL_PROJECTIONS) and kind in ("weight", "bias", "scales"):
                    tensor = tensor.float() * m
                yield name, tensor

        return super().load_weights(scaled())
