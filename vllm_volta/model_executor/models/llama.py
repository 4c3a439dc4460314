"""Llama family (Llama 2/3/3.x, SmolLM2, Mistral) on the paged-attention layer vocabulary.

The decoder here is also the base of Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm): a
subclass only says which of those options its config means (``attention_options``). Gemma 2 / 3
bring their own decoder layer (``decoder_layer_cls``) around the same attention and MLP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from vllm_volta.model_executor.layers.activation import SiluAndMul, get_act_and_mul_fn
from vllm_volta.model_executor.layers.decode_gemv import rope_cache_linear, silu_and_mul_linear
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.logits import LogitsProcessor
from vllm_volta.model_executor.layers.pipeline_stage import PipelineStage
from vllm_volta.model_executor.layers.rotary_embedding import get_rope, rope_params_from_config
from vllm_volta.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                       VocabParallelEmbedding)
from vllm_volta.model_executor.models.utils import (config_head_dim, default_dtype, layer_sliding_window,
                                                    load_hf_weights)


class LlamaMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)) with gate/up fused."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias)
        self.act_fn = get_act_and_mul_fn(hidden_act)
        # Decode-sized inputs: gate_up and silu_and_mul in one gemv launch (decode_gemv.py).
        self.fused_act = isinstance(self.act_fn, SiluAndMul) and self.gate_up_proj.quant_method is None

    def activation(self, x: torch.Tensor, norm: RMSNorm | None = None) -> torch.Tensor:
        """act(gate) * up: the input of down_proj (gate/up of norm(x) with `norm`)."""
        if self.fused_act:
            gate_up = self.gate_up_proj
            return silu_and_mul_linear(x, gate_up.weight, gate_up.bias, gate_up.use_gemv, self.act_fn, norm)
        return self.act_fn(self.gate_up_proj(x, norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(x))


class LlamaAttention(nn.Module):
    """Fused qkv projection, optional per-head q/k norm, RoPE, paged attention, o_proj.

    The layer's sliding window comes from the config (layer_sliding_window); ``scale`` defaults
    to head_dim ** -0.5; ``logits_soft_cap``: Gemma 2's attention-logit soft-capping."""

    def __init__(self, config: Any, attn_backend: type | None, rotary_emb: nn.Module, layer_idx: int,
                 *, qkv_bias: bool, o_bias: bool, qk_norm: bool, scale: float | None = None,
                 logits_soft_cap: float | None = None) -> None:
        super().__init__()
        self.head_dim = config_head_dim(config)
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_heads,
                                          total_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size, o_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.rotary_emb = rotary_emb  # shared by the layers with the same RoPE parameters
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.attn = Attention(self.qkv_proj.num_heads, self.head_dim,
                              self.head_dim ** -0.5 if scale is None else scale,
                              self.qkv_proj.num_kv_heads, attn_backend,
                              sliding_window=layer_sliding_window(config, layer_idx),
                              logits_soft_cap=logits_soft_cap)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        return self.o_proj(self.attend(positions, hidden_states, kv_cache, attn_metadata))

    def attend(self, positions: torch.Tensor, hidden_states: torch.Tensor,
               kv_cache: torch.Tensor, attn_metadata: AttentionMetadata,
               norm: RMSNorm | None = None) -> torch.Tensor:
        """The attention output, before o_proj (of norm(hidden_states) with `norm`)."""
        proj = self.qkv_proj
        if self.attn.kv_cache_group:  # the fused cache write below takes this group's slots
            attn_metadata = attn_metadata.for_group(self.attn.kv_cache_group)
        if not self.qk_norm and proj.quant_method is None:  # decode sizes: projection, RoPE, cache write in one kernel
            qkv = rope_cache_linear(hidden_states, proj.weight, proj.bias, proj.use_gemv, norm, self.rotary_emb,
                                    positions, kv_cache, attn_metadata.slot_mapping)
            if qkv is not None:
                q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
                return self.attn(q, k, v, kv_cache, attn_metadata, kv_cached=True)
        qkv = proj(hidden_states, norm)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # RMSNorm over each head's vector, before RoPE (Qwen3)
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        return self.attn(q, k, v, kv_cache, attn_metadata, rope=(self.rotary_emb, positions))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block; the residual stream is carried separately so the norms can fuse the add.

    On one rank o_proj and down_proj add their outputs straight into the residual stream
    (RowParallelLinear.add_into_: gemv_add at decode sizes, decode_gemv.py, else the GEMM
    accumulating into the residual), so each pre-norm reads the residual alone: at decode sizes
    it is the prologue of the gemv it feeds (qkv_proj, gate_up_proj) and no norm kernel runs,
    else a plain rms_norm. A layer then returns ``(None, residual)``: the residual already holds
    the sum.
    """

    def __init__(self, config: Any, attn_backend: type | None, rotary_emb: nn.Module, layer_idx: int,
                 attention_options: dict[str, Any]) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, attn_backend, rotary_emb, layer_idx, **attention_options)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size,
                            getattr(config, "hidden_act", "silu"),
                            bias=bool(getattr(config, "mlp_bias", False)))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor | None,
                residual: torch.Tensor | None, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> tuple[torch.Tensor | None, torch.Tensor]:
        pre_norm = None
        if residual is None or hidden_states is None:
            # The residual stream is this layer's input (the first layer: the embeddings).
            residual = hidden_states if residual is None else residual
            hidden_states, pre_norm = residual, self.input_layernorm
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        attn_out = self.self_attn.attend(positions, hidden_states, kv_cache, attn_metadata, pre_norm)
        if self.self_attn.o_proj.add_into_(residual, attn_out):
            mlp_act = self.mlp.activation(residual, self.post_attention_layernorm)
        else:
            hidden_states, residual = self.post_attention_layernorm(self.self_attn.o_proj(attn_out), residual)
            mlp_act = self.mlp.activation(hidden_states)
        if self.mlp.down_proj.add_into_(residual, mlp_act):
            return None, residual
        return self.mlp.down_proj(mlp_act), residual


def layer_rotary_embs(config: Any) -> list[nn.Module]:
    """Each layer's RoPE table; layers whose parameters are equal share one (all of them but in
    Gemma 3, whose sliding and full layers differ: ``layer_types`` with rope_params_from_config)."""
    head_dim = config_head_dim(config)
    layer_types = getattr(config, "layer_types", None) or [None] * config.num_hidden_layers
    tables: dict[str, nn.Module] = {}
    embs = []
    for layer_idx in range(config.num_hidden_layers):
        theta, scaling = rope_params_from_config(config, layer_types[layer_idx])
        key = repr((theta, scaling))
        if key not in tables:
            tables[key] = get_rope(head_dim, head_dim, config.max_position_embeddings, theta,
                                   is_neox_style=True, rope_scaling=scaling)
        embs.append(tables[key])
    return embs


class LlamaModel(nn.Module):
    """Embedding, decoder layers (``layer_cls``), final norm."""

    def __init__(self, config: Any, attn_backend: type | None, attention_options: dict[str, Any],
                 layer_cls: type[nn.Module] = LlamaDecoderLayer) -> None:
        super().__init__()
        # Pipeline parallelism: this stage's layers only (a tied LM head keeps the embeddings).
        self.pp = pp = PipelineStage(config.num_hidden_layers, config.hidden_size)
        self.embed_tokens = pp.here(lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size),
                                    on_first=True, on_last=bool(getattr(config, "tie_word_embeddings", False)))
        rotary_embs = layer_rotary_embs(config)
        self.layers = pp.make_layers(config.num_hidden_layers, lambda i: layer_cls(
            config, attn_backend, rotary_embs[i], i, attention_options))
        self.norm = pp.here(lambda: RMSNorm(config.hidden_size, config.rms_norm_eps), on_last=True)
        self.embed_scale: float | None = None  # the embeddings' multiplier (Gemma: sqrt(hidden))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                final_norm: bool = True) -> torch.Tensor:
        """The final hidden states; with ``final_norm=False`` the residual stream before the final
        norm (LlamaForCausalLM.compute_logits can apply it to the rows it projects). A pipeline
        stage other than the last sends its output to the next stage and returns None."""
        pp = self.pp
        pp.check_caches(kv_caches)
        if pp.is_first:
            hidden_states = self.embed_tokens(input_ids)
            if self.embed_scale is not None:
                hidden_states.mul_(self.embed_scale)
            residual = None
        else:
            hidden_states, residual = pp.receive(input_ids.shape[0], input_ids.device)
        for layer, kv_cache in zip(pp.layers(self.layers), kv_caches):
            hidden_states, residual = layer(positions, hidden_states, residual, kv_cache,
                                            attn_metadata)
        if not pp.is_last:
            return pp.send(hidden_states, residual)
        if not final_norm:
            return residual if hidden_states is None else hidden_states + residual
        if hidden_states is None:  # the last layer added into the residual stream
            return self.norm(residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """Causal LM: ``forward`` -> final hidden states, ``compute_logits`` -> logits (model dtype).
    The engine defers the final norm to ``compute_logits`` (see there)."""

    decoder_layer_cls: type[nn.Module] = LlamaDecoderLayer

    @classmethod
    def attention_options(cls, config: Any) -> dict[str, Any]:
        """LlamaAttention's options that this architecture's config implies (projection biases,
        q/k norm; Gemma 2: scale, attention soft cap)."""
        bias = bool(getattr(config, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": False}

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None
                 ) -> None:
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        with default_dtype(dtype):
            self.model = LlamaModel(hf_config, attn_backend, self.attention_options(hf_config),
                                    self.decoder_layer_cls)
            # A tied head's own weight is never used: build it on "meta" (no memory), then tie.
            with torch.device("meta") if self.tie_word_embeddings else contextlib.nullcontext():
                self.lm_head = self.model.pp.here(
                    lambda: ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size), on_last=True)
        if self.tie_word_embeddings and self.model.pp.is_last:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(
            hf_config.vocab_size, soft_cap=getattr(hf_config, "final_logit_softcapping", None))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                final_norm: bool = True) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata, final_norm)

    def compute_logits(self, hidden_states: torch.Tensor, apply_final_norm: bool = False
                       ) -> torch.Tensor:
        """Logits of final hidden states, or of rows of the residual stream before the final
        norm (``forward(final_norm=False)``) with ``apply_final_norm``: at decode sizes the norm
        is then the lm_head gemv's prologue, and elsewhere it runs on these rows only."""
        norm = self.model.norm if apply_final_norm else None
        return self.logits_processor(self.lm_head, hidden_states, norm)

    def final_hidden(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Rows of the residual stream before the final norm (``forward(final_norm=False)``) ->
        the model's final hidden states (embedding requests pool them)."""
        return self.model.norm(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; returns the names of the parameters that were filled."""
        return load_hf_weights(self, weights, tie_word_embeddings=self.tie_word_embeddings)


class SlidingWindowSpecs:
    """``kv_cache_specs`` for models on LlamaModel whose layers may slide: each layer's cache
    spec from its Attention (this rank's KV heads), sliding where its window is set, so the
    blocks that leave the window return to the pool (core/kv_cache_groups.py)."""

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        specs: list[KVCacheSpec] = []
        for layer in self.model.pp.layers(self.model.layers):
            attn = layer.self_attn.attn
            window = attn.impl.sliding_window
            if window:
                specs.append(SlidingWindowSpec(attn.num_kv_heads, attn.head_size, self.dtype,
                                               sliding_window=window))
            else:
                specs.append(FullAttentionSpec(attn.num_kv_heads, attn.head_size, self.dtype))
        return specs


class MistralForCausalLM(SlidingWindowSpecs, LlamaForCausalLM):
    """Mistral: the Llama architecture, with sliding-window attention where the config sets a
    window (v0.1: 4096)."""
