"""Gemma 4's decoder layer: attention with q/k/v norms, the MLP (beside routed experts in the MoE
models), the per-layer input (E2B / E4B) and the layer scalar.

Float16: the residual stream is kept in ``residual_dtype`` (float32 when the model runs in
float16). Each block reads an RMS norm of it cast to the model dtype, and its normalised output
is added back in float32, so the stream's growth cannot overflow float16. The per-layer input
branch reads the stream without a norm, so it runs in the residual dtype too (its weights are
small: hidden x 256 per layer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.linear import (ColumnParallelLinear, QKVParallelLinear,
                                                     ReplicatedLinear, RowParallelLinear)
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.parallel_state import divide, get_tensor_model_parallel_world_size
from vllm_volta.model_executor.models.gemma4_plan import Gemma4LayerPlan
from vllm_volta.model_executor.models.llama import LlamaMLP

# HF hidden_activation -> F.gelu's approximate (the per-layer input gate's plain activation).
_GELU_APPROXIMATE = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}

# Keys and values of the layers other layers read, by layer index, filled during one forward.
SharedKV = dict[int, tuple[torch.Tensor, torch.Tensor]]


def rms_unscaled(x: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMS norm without a weight (Gemma 4's v_norm and router norm), in float32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(out_dtype or x.dtype)


class Gemma4RMSNorm(RMSNorm):
    """RMSNorm (``x * weight``, no Gemma-1-3 offset) whose output dtype may differ from its input:
    the fp32 residual stream in, the model dtype out, or back. Equal dtypes run RMSNorm's op."""

    def __init__(self, hidden_size: int, eps: float, out_dtype: torch.dtype | None = None) -> None:
        super().__init__(hidden_size, eps)
        self.out_dtype = out_dtype or self.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if x.dtype == self.weight.dtype == self.out_dtype:
            return super().forward(x)
        return (rms_unscaled(x, self.variance_epsilon, torch.float32) * self.weight.float()).to(self.out_dtype)


def _kv_heads_per_rank(total: int) -> int:
    tp = get_tensor_model_parallel_world_size()  # as QKVParallelLinear: replicated below tp heads
    return 1 if tp >= total else total // tp


class Gemma4Attention(nn.Module):
    """q/k norms (with weights) and a v norm (without) per head, RoPE, attention at scale 1.0.

    A KV-shared layer has only a query projection (``query_proj``, HF's q_proj): it attends over
    its source layer's cache with the keys and values that layer computed this step
    (``shared_kv``), writing nothing. A ``k_eq_v`` layer's checkpoint has no v_proj: its k_proj
    loads into both the k and v parts of qkv_proj, so the values are the keys before k_norm and
    RoPE, as in transformers (one projection's worth of extra columns, in the full layers only)."""

    def __init__(self, config: Any, plan: Gemma4LayerPlan, attn_backend: type | None,
                 rotary_emb: nn.Module) -> None:
        super().__init__()
        d, heads, bias = plan.head_dim, config.num_attention_heads, bool(getattr(config, "attention_bias", False))
        self.head_dim, self.eps = d, config.rms_norm_eps
        self.kv_source, self.stores_kv = plan.kv_source, plan.stores_kv
        if self.kv_source is None:
            self.qkv_proj = QKVParallelLinear(config.hidden_size, d, heads, plan.num_kv_heads, bias=bias)
            self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
            kv_heads = self.qkv_proj.num_kv_heads
        else:
            self.query_proj = ColumnParallelLinear(config.hidden_size, heads * d, bias=bias)
            kv_heads = _kv_heads_per_rank(plan.num_kv_heads)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.o_proj = RowParallelLinear(heads * d, config.hidden_size, bias)
        self.rotary_emb = rotary_emb
        heads_here = divide(heads, get_tensor_model_parallel_world_size(), "num_attention_heads")
        self.attn = Attention(heads_here, d, 1.0, kv_heads, attn_backend, sliding_window=plan.sliding_window)

    def _per_head(self, norm: Any, x: torch.Tensor) -> torch.Tensor:
        return norm(x.reshape(-1, self.head_dim)).view(x.shape[0], -1)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, shared_kv: SharedKV, layer_idx: int) -> torch.Tensor:
        if self.kv_source is not None:
            q, _ = self.rotary_emb(positions, self._per_head(self.q_norm, self.query_proj(x)))
            k, v = shared_kv[self.kv_source]  # already in the cache (the source layer wrote them)
            return self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata, kv_cached=True))
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self._per_head(self.q_norm, q)
        k = self._per_head(self.k_norm, k)
        v = rms_unscaled(v.reshape(-1, self.head_dim), self.eps).view(v.shape[0], -1)
        if self.stores_kv:  # RoPE here, so the rotated keys can be handed on
            q, k = self.rotary_emb(positions, q, k)
            shared_kv[layer_idx] = (k, v)
            out = self.attn(q, k, v, kv_cache, attn_metadata)
        else:
            out = self.attn(q, k, v, kv_cache, attn_metadata, rope=(self.rotary_emb, positions))
        return self.o_proj(out)


class Gemma4Experts(MoE):
    """The MoE layer routed as Gemma 4 routes: the gate reads ``router_input`` (its own norm of
    the residual stream), not the experts' input; the top-k probabilities are renormalised and
    multiplied by a learned scale per expert (``expert_scales``, HF's router.per_expert_scale)."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 hidden_act: str) -> None:
        super().__init__(num_experts, top_k, hidden_size, intermediate_size, renormalize=True,
                         hidden_act=hidden_act)
        self.expert_scales = nn.Parameter(torch.ones(num_experts), requires_grad=False)
        self._router_input: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids int32 [T, k], their weights float32 [T, k]) from the router input."""
        if self._router_input is None:
            raise RuntimeError("Gemma4Experts runs through forward(x, router_input)")
        probs = torch.softmax(self.gate(self._router_input).float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True) * self.expert_scales[ids].float()
        return ids.to(torch.int32), weights

    def forward(self, x: torch.Tensor, router_input: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        self._router_input = router_input  # read by route(), which MoE.forward calls first
        try:
            return super().forward(x)
        finally:
            self._router_input = None


class Gemma4FeedForward(nn.Module):
    """The MLP block on the residual stream ``h``: the GeGLU MLP of pre_feedforward_layernorm(h);
    in MoE layers also the routed experts of pre_feedforward_layernorm_2(h), routed by
    ``router_scale * norm(h) / sqrt(hidden)``, the two outputs each normalised and summed. Returns
    the block output before post_feedforward_layernorm (in the residual dtype)."""

    def __init__(self, config: Any, plan: Gemma4LayerPlan, residual_dtype: torch.dtype) -> None:
        super().__init__()
        h, eps, act = config.hidden_size, config.rms_norm_eps, config.hidden_activation
        dtype = torch.get_default_dtype()
        self.pre_feedforward_layernorm = Gemma4RMSNorm(h, eps, out_dtype=dtype)
        self.mlp = LlamaMLP(h, config.intermediate_size * (2 if plan.double_wide_mlp else 1), act)
        self.moe = bool(getattr(config, "enable_moe_block", False))
        if not self.moe:
            return
        for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not getattr(config, name, None):
                raise ValueError(f"enable_moe_block needs {name} (a positive integer), got "
                                 f"{getattr(config, name, None)!r}")
        self.post_feedforward_layernorm_1 = Gemma4RMSNorm(h, eps, out_dtype=residual_dtype)
        self.pre_feedforward_layernorm_2 = Gemma4RMSNorm(h, eps, out_dtype=dtype)
        self.post_feedforward_layernorm_2 = Gemma4RMSNorm(h, eps, out_dtype=residual_dtype)
        self.router_scale = nn.Parameter(torch.ones(h), requires_grad=False)
        self.experts = Gemma4Experts(config.num_experts, config.top_k_experts, h, config.moe_intermediate_size, act)
        self.eps, self.router_factor = eps, h ** -0.5

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.mlp(self.pre_feedforward_layernorm(h))
        if not self.moe:
            return out
        dtype = self.router_scale.dtype
        router_input = rms_unscaled(h, self.eps, dtype) * self.router_scale * self.router_factor
        routed = self.experts(self.pre_feedforward_layernorm_2(h), router_input=router_input)
        return self.post_feedforward_layernorm_1(out) + self.post_feedforward_layernorm_2(routed)


class Gemma4DecoderLayer(nn.Module):
    """``h += post_attention_norm(attn(input_norm(h)))``; ``h += post_feedforward_norm(ffn(h))``;
    with per-layer inputs ``h += post_per_layer_input_norm(proj(act(gate(h)) * per_layer_input))``;
    then ``h *= layer_scalar``. Takes and returns the residual stream ``h``."""

    def __init__(self, config: Any, plan: Gemma4LayerPlan, attn_backend: type | None, rotary_emb: nn.Module,
                 layer_idx: int, residual_dtype: torch.dtype) -> None:
        super().__init__()
        h, eps, dtype = config.hidden_size, config.rms_norm_eps, torch.get_default_dtype()
        self.layer_idx = layer_idx
        self.input_layernorm = Gemma4RMSNorm(h, eps, out_dtype=dtype)
        self.self_attn = Gemma4Attention(config, plan, attn_backend, rotary_emb)
        self.post_attention_layernorm = Gemma4RMSNorm(h, eps, out_dtype=residual_dtype)
        self.feed_forward = Gemma4FeedForward(config, plan, residual_dtype)
        self.post_feedforward_layernorm = Gemma4RMSNorm(h, eps, out_dtype=residual_dtype)
        self.layer_scalar = nn.Parameter(torch.ones(1, dtype=residual_dtype), requires_grad=False)
        self.per_layer_size = int(getattr(config, "hidden_size_per_layer_input", 0) or 0)
        if self.per_layer_size:
            act = config.hidden_activation
            if act not in _GELU_APPROXIMATE:
                raise ValueError(f"hidden_activation must be one of {', '.join(_GELU_APPROXIMATE)} with "
                                 f"per-layer inputs, got {act!r}")
            self.gelu_approximate = _GELU_APPROXIMATE[act]
            p = self.per_layer_size
            self.per_layer_input_gate = ReplicatedLinear(h, p, params_dtype=residual_dtype)
            self.per_layer_projection = ReplicatedLinear(p, h, params_dtype=residual_dtype)
            self.post_per_layer_input_norm = Gemma4RMSNorm(h, eps, out_dtype=residual_dtype)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, per_layer_input: torch.Tensor | None,
                shared_kv: SharedKV) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(h), kv_cache, attn_metadata, shared_kv,
                              self.layer_idx)
        h = h + self.post_attention_layernorm(attn)
        h = h + self.post_feedforward_layernorm(self.feed_forward(h))
        if self.per_layer_size:
            gate = F.gelu(self.per_layer_input_gate(h), approximate=self.gelu_approximate)
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gate * per_layer_input))
        return h * self.layer_scalar
