"""Qwen2-MoE (``Qwen2MoeForCausalLM``: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention
(q/k/v biases) with a mixture-of-experts ``mlp`` (top-4 of 60, not renormalized unless
``norm_topk_prob``) plus a shared expert every token goes through, scaled by
sigmoid(``shared_expert_gate``(x)); dense MLPs in the layers of ``mlp_only_layers`` or off
``decoder_sparse_step``, as Qwen3-MoE."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_volta.model_executor.layers.linear import ReplicatedLinear
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.quantization import quantization
from vllm_volta.model_executor.models.llama import LlamaMLP
from vllm_volta.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm_volta.model_executor.models.qwen3_moe import Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM


class SharedExpertMoE(MoE):
    """The routed experts plus ``shared_expert`` (a gated MLP) weighted by its sigmoid gate."""

    def __init__(self, config: Any, renormalize: bool | None = None) -> None:
        """``renormalize``: top-k weights summed to 1 (default: the config's ``norm_topk_prob``)."""
        if renormalize is None:
            renormalize = bool(getattr(config, "norm_topk_prob", False))
        super().__init__(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                         config.moe_intermediate_size, renormalize=renormalize, hidden_act=config.hidden_act)
        self.shared_expert = LlamaMLP(config.hidden_size, config.shared_expert_intermediate_size, config.hidden_act)
        # TP-sharded; its partial output joins the routed experts' in MoE's one all-reduce.
        self.shared_expert.down_proj.reduce_results = False
        with quantization(None):  # one output: never quantized in the checkpoints
            self.shared_expert_gate = ReplicatedLinear(config.hidden_size, 1)

    def forward_local(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward_local(x) + shared


class Qwen2MoeDecoderLayer(Qwen3MoeDecoderLayer):
    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if self.is_dense(config, layer_idx):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        return SharedExpertMoE(config)


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    """Qwen2MoeForCausalLM; experts load from ``mlp.experts.N.*``, the shared expert as a dense MLP."""

    decoder_layer_cls = Qwen2MoeDecoderLayer
    attention_options = Qwen2ForCausalLM.attention_options
