"""Gemma 3, text in and out: ``Gemma3ForCausalLM`` (model_type gemma3_text: Gemma 3 1B and
text-only checkpoints), and the language model of the image-text checkpoints (4B, 12B, 27B:
``Gemma3ForConditionalGeneration``, without their vision tower). Gemma 2 (gemma2.py) with

- an RMSNorm (1 + weight) over each query / key head before RoPE, as Qwen3's;
- two RoPE tables: the sliding layers' (rope_theta 10k) and the full layers' (1M, linear scaling
  in the larger models), from ``rope_parameters`` keyed by layer type (transformers 5) or
  ``rope_local_base_freq`` beside ``rope_theta`` / ``rope_scaling`` (before);
- five sliding-window layers to one full one; soft caps only where the config sets them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from vllm_volta.logger import init_logger, warning_once
from vllm_volta.model_executor.models.gemma2 import Gemma2ForCausalLM
from vllm_volta.model_executor.models.utils import language_model_weights

logger = init_logger(__name__)

# An image-text checkpoint's tensors outside its language model (which it keeps under
# "language_model.model." before transformers 5, "model.language_model." since: utils.py).
_SKIPPED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma3ForCausalLM; extra weights ``self_attn.q_norm`` / ``self_attn.k_norm`` per layer."""

    sliding_window_pattern = 6

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, Any]:
        return {**super().attention_options(config), "qk_norm": True}


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The language model of a Gemma 3 image-text checkpoint (its ``text_config``); prompts are
    text only: the vision tower is not loaded."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None
                 ) -> None:
        warning_once(logger, "Gemma3ForConditionalGeneration: serving its language model; image inputs "
                     "are not supported (the vision tower is not loaded)")
        super().__init__(hf_config.text_config, dtype=dtype, attn_backend=attn_backend)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(language_model_weights(weights, _SKIPPED_PREFIXES))
