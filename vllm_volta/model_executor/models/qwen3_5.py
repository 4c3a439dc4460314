"""Qwen3.5, text in and out: ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` and the
language model of the hub's image-text checkpoints (``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration``: weights under ``model.language_model.``, the vision
tower and the multi-token-prediction head not loaded).

The decoder is Qwen3-Next's (qwen3_next.py): Gated DeltaNet layers and gated full attention.
Qwen3.5's DeltaNet stores its projections separately (in_proj_qkv, in_proj_z, in_proj_b,
in_proj_a; GatedDeltaNet.load_hf_weight fuses them); the dense models have a gated MLP in every
layer, the MoE models a MoE block (top-k renormalized, plus the sigmoid-gated shared expert) in
every layer. Its M-RoPE (``mrope_section``) reduces to 1-D RoPE on text, where the temporal,
height and width positions are all the token's position.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_volta.logger import init_logger, warning_once
from vllm_volta.model_executor.models.llama import LlamaMLP
from vllm_volta.model_executor.models.qwen3_next import Qwen3NextForCausalLM, SharedExpertMoE

logger = init_logger(__name__)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 dense: a gated MLP in every layer. Decode steps are CUDA-graph safe: the DeltaNet's
    decode (its CUDA kernels, or the PyTorch ops' batched step) reads the slots on the device."""

    supports_cuda_graphs = True

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 MoE: a MoE block with the shared expert in every layer, top-k renormalized."""

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        return SharedExpertMoE(config, renormalize=True)


def _text_config(hf_config: Any, arch: str) -> Any:
    """An image-text config's ``text_config`` (its head tying and state dtype where only the
    outer config gives them)."""
    warning_once(logger, f"{arch}: serving its language model; image and video inputs are not "
                 "supported (the vision tower is not loaded)")
    text = getattr(hf_config, "text_config", None)
    if text is None:
        raise ValueError(f"{arch} config needs a text_config")
    if getattr(text, "mamba_ssm_dtype", None) is None and getattr(hf_config, "mamba_ssm_dtype", None):
        text.mamba_ssm_dtype = hf_config.mamba_ssm_dtype
    return text


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The language model of a Qwen3.5 image-text checkpoint (its ``text_config``)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None) -> None:
        super().__init__(_text_config(hf_config, type(self).__name__), dtype=dtype, attn_backend=attn_backend,
                         tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)))


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The language model of a Qwen3.5-MoE image-text checkpoint (its ``text_config``)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None) -> None:
        super().__init__(_text_config(hf_config, type(self).__name__), dtype=dtype, attn_backend=attn_backend,
                         tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)))
