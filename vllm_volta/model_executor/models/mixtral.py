"""Mixtral (``MixtralForCausalLM``): the Llama decoder with a mixture-of-experts MLP in every
layer (``block_sparse_moe``: top-2 of 8 experts, weights renormalized). The MoE decoder layer
and the experts' weight loading here are shared with Qwen3-MoE (qwen3_moe.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.moe import supports_cuda_graphs as moe_supports_cuda_graphs
from vllm_volta.model_executor.layers.pipeline_stage import is_pp_missing
from vllm_volta.model_executor.models.llama import LlamaAttention, LlamaForCausalLM
from vllm_volta.model_executor.models.utils import load_hf_weights

# Checkpoint names of one expert's weight: (the MoE module, expert, part).
# The suffix is "weight", or a quantized tensor's name (qweight, scales, weight_scale_inv, ...).
_EXPERT = re.compile(r"^(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(\w+)$")
_PARTS = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


class MoEDecoderLayer(nn.Module):
    """Pre-norm attention, then the layer's MLP (``mlp_name``: a MoE, or a dense LlamaMLP where
    a subclass says so), each added to the residual stream."""

    mlp_name = "block_sparse_moe"

    def __init__(self, config: Any, attn_backend: type | None, rotary_emb: nn.Module, layer_idx: int,
                 attention_options: dict[str, Any]) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, attn_backend, rotary_emb, layer_idx, **attention_options)
        setattr(self, self.mlp_name, self.make_mlp(config, layer_idx))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        return MoE(config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
                   config.intermediate_size, renormalize=True, hidden_act=config.hidden_act)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        attn_out = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(attn_out, residual)
        return getattr(self, self.mlp_name)(hidden_states), residual


class MixtralForCausalLM(LlamaForCausalLM):
    """MixtralForCausalLM; experts load from ``block_sparse_moe.experts.N.w1/w3/w2``."""

    decoder_layer_cls = MoEDecoderLayer

    @property
    def supports_cuda_graphs(self) -> bool:
        """True when every MoE layer runs its routing and experts on the device (layers/moe.py)."""
        return moe_supports_cuda_graphs(self)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The experts' weights into their MoE's stacked tensors (counted loaded once every
        expert's three parts came), the rest as Llama's."""
        seen: dict[str, int] = {}
        moes: dict[str, MoE] = {}

        def others() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                match = _EXPERT.match(name)
                if match is None:
                    yield name, tensor
                    continue
                prefix, expert, part = match.group(1), int(match.group(2)), _PARTS[match.group(3)]
                if is_pp_missing(self, prefix):
                    continue  # another pipeline stage's layer
                moe = moes.get(prefix)
                if moe is None:
                    moe = moes[prefix] = self.get_submodule(prefix)
                moe.load_expert(expert, part, tensor, match.group(4))
                seen[prefix] = seen.get(prefix, 0) + moe.is_required_expert_tensor(match.group(4))

        loaded = load_hf_weights(self, others(), tie_word_embeddings=self.tie_word_embeddings)
        for prefix, moe in moes.items():
            if seen[prefix] == 3 * moe.num_experts * moe.expert_tensors_per_part():
                loaded |= {f"{prefix}.{name}" for name in moe.expert_param_names()}
        return loaded
