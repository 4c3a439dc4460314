"""Qwen3-MoE (``Qwen3MoeForCausalLM``, e.g. Qwen3-30B-A3B): Qwen3's attention (per-head q/k
norms) with a mixture-of-experts ``mlp`` (top-8 of 128 experts; weights renormalized when
``norm_topk_prob``), and dense MLPs in the layers of ``mlp_only_layers`` or off
``decoder_sparse_step``."""

from __future__ import annotations

from typing import Any

from torch import nn

from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.models.llama import LlamaMLP
from vllm_volta.model_executor.models.mixtral import MixtralForCausalLM, MoEDecoderLayer
from vllm_volta.model_executor.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeDecoderLayer(MoEDecoderLayer):
    mlp_name = "mlp"

    @staticmethod
    def is_dense(config: Any, layer_idx: int) -> bool:
        """Whether the layer has a dense MLP (``mlp_only_layers``, or off ``decoder_sparse_step``)."""
        step = getattr(config, "decoder_sparse_step", 1) or 1
        return layer_idx in (getattr(config, "mlp_only_layers", None) or []) or bool((layer_idx + 1) % step)

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if self.is_dense(config, layer_idx):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        return MoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                   config.moe_intermediate_size, renormalize=bool(getattr(config, "norm_topk_prob", False)),
                   hidden_act=config.hidden_act)


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3MoeForCausalLM; experts load from ``mlp.experts.N.gate_proj/up_proj/down_proj``."""

    decoder_layer_cls = Qwen3MoeDecoderLayer
    attention_options = Qwen3ForCausalLM.attention_options
