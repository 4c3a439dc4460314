"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE) in PyTorch ops.

Each token's router logits (``gate``, a replicated linear layer) go through a float32 softmax;
its ``top_k`` experts are the largest probabilities (renormalized to sum to 1 when
``renormalize``), and its output is the probability-weighted sum of those experts' gated MLPs,
down(act(gate(x)) * up(x)). The experts' weights are stacked: ``w13`` [E, 2I, H] (gate rows,
then up rows) and ``w2`` [E, H, I]; with tensor parallelism each rank holds a slice of every
expert's intermediate size and the partial outputs are summed across ranks.

The tokens are grouped by expert on the host (a device-to-host copy of the routing each layer),
and each used expert runs two GEMMs on its tokens: correct on every device, but the shapes
depend on the routing, so steps of MoE models run without CUDA graphs.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta.model_executor.layers.activation import get_act_and_mul_fn
from vllm_volta.model_executor.layers.linear import ReplicatedLinear, copy_weight, take_shard
from vllm_volta.model_executor.layers.parallel_state import (
    divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce)
from vllm_volta.model_executor.layers.quantization import current_quant_config


class MoE(nn.Module):
    """x [T, H] -> [T, H]; checkpoint experts load through ``load_expert``."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, hidden_act: str = "silu", per_expert_scale: bool = False) -> None:
        super().__init__()
        if current_quant_config() is not None:
            raise ValueError("quantization_config: quantized mixture-of-experts models are not supported")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.intermediate = divide(intermediate_size, self.tp_size, "moe intermediate size")
        self.gate = ReplicatedLinear(hidden_size, num_experts)
        dtype = torch.get_default_dtype()
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.intermediate, hidden_size, dtype=dtype),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.intermediate, dtype=dtype),
                               requires_grad=False)
        self.act_fn = get_act_and_mul_fn(hidden_act)
        # Gemma 4: each expert's routing weight is multiplied by a learned scale (after renormalize).
        self.per_expert_scale = (nn.Parameter(torch.ones(num_experts, dtype=dtype), requires_grad=False)
                                 if per_expert_scale else None)

    def load_expert(self, expert: int, part: str, loaded: torch.Tensor) -> None:
        """One expert's checkpoint weight: ``part`` "gate" / "up" ([I, H]) or "down" ([H, I])."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert index {expert} is outside [0, {self.num_experts})")
        n = self.intermediate
        if part == "down":
            copy_weight(self.w2.data[expert], take_shard(loaded, 1, self.tp_rank, n, n * self.tp_size))
            return
        offset = {"gate": 0, "up": n}[part]
        copy_weight(self.w13.data[expert, offset:offset + n], take_shard(loaded, 0, self.tp_rank, n, n * self.tp_size))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, k], their weights [T, k] in x's dtype)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        if self.per_expert_scale is not None:
            weights = weights * self.per_expert_scale[ids].float()
        return ids, weights.to(x.dtype)

    def forward(self, x: torch.Tensor, router_input: torch.Tensor | None = None) -> torch.Tensor:
        """``router_input``: what the gate reads, when not ``x`` (Gemma 4 routes on its own norm
        of the residual stream)."""
        ids, weights = self.route(x if router_input is None else router_input)
        out = torch.zeros_like(x)
        flat = ids.flatten()
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # the one host sync
        tokens = order // self.top_k
        pair_weights = weights.flatten()[order]  # in expert order, as tokens
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = tokens[start:start + count]
            w = pair_weights[start:start + count]
            h = self.act_fn(x[rows] @ self.w13[expert].t()) @ self.w2[expert].t()
            out.index_add_(0, rows, h * w[:, None])
            start += count
        return tensor_model_parallel_all_reduce(out) if self.tp_size > 1 else out
