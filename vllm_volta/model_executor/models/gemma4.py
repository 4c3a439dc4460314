"""Gemma 4, text in and out: ``Gemma4ForCausalLM`` (model_type gemma4_text) and the language model
of the hub's checkpoints (``Gemma4ForConditionalGeneration``; its vision and audio towers are not
loaded). Every size:

- E2B / E4B: per-layer input embeddings (a second, packed embedding table plus a projection of
  the embeddings, one slice of ``hidden_size_per_layer_input`` per layer), the last
  ``num_kv_shared_layers`` layers reading earlier layers' caches, double-wide MLPs there;
- 31B (dense): full layers with ``attention_k_eq_v`` (keys double as values), their own head size
  and KV-head count;
- 26B-A4B (MoE): routed experts beside the dense MLP in every layer.

Versus Gemma 3: norms scale by ``weight`` (no ``1 +``), values are RMS-normalised too, attention
scale 1.0, full layers use "proportional" RoPE, and each layer ends by scaling the residual
stream by its ``layer_scalar``. The per-layer settings are in gemma4_plan.py, the layer in
gemma4_layers.py.

In float16 the residual stream stays float32 (``residual_dtype``): Gemma's stream outgrows
float16's range, and each block only reads a normalised copy of it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, KVCacheSpec, SharedKVSpec, SlidingWindowSpec
from vllm_volta.logger import info_once, init_logger, warning_once
from vllm_volta.model_executor.layers.linear import ReplicatedLinear
from vllm_volta.model_executor.layers.logits import LogitsProcessor
from vllm_volta.model_executor.layers.parallel_state import get_pipeline_model_parallel_world_size
from vllm_volta.model_executor.layers.rotary_embedding import get_rope, rope_params_from_config
from vllm_volta.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm_volta.model_executor.models.gemma4_layers import Gemma4DecoderLayer, Gemma4RMSNorm, SharedKV
from vllm_volta.model_executor.models.gemma4_plan import Gemma4LayerPlan, layer_plans
from vllm_volta.model_executor.models.utils import default_dtype, language_model_weights, load_hf_weights

logger = init_logger(__name__)


def _rotary_tables(config: Any, plans: list[Gemma4LayerPlan]) -> list[nn.Module]:
    """One RoPE table per layer type (its head size and parameters), shared by its layers."""
    tables: dict[str, nn.Module] = {}
    for plan in plans:
        if plan.layer_type not in tables:
            theta, scaling = rope_params_from_config(config, plan.layer_type)
            tables[plan.layer_type] = get_rope(plan.head_dim, plan.head_dim, config.max_position_embeddings,
                                               theta, is_neox_style=True, rope_scaling=scaling)
    return [tables[plan.layer_type] for plan in plans]


class Gemma4Model(nn.Module):
    """Embeddings (and per-layer inputs), decoder layers, final norm."""

    def __init__(self, config: Any, attn_backend: type | None, residual_dtype: torch.dtype) -> None:
        super().__init__()
        if (pp := get_pipeline_model_parallel_world_size()) > 1:
            # Its KV-shared layers read caches of earlier layers, its per-layer inputs come from the
            # embeddings: both would have to cross stages.
            raise ValueError(f"Gemma 4 does not support pipeline_parallel_size={pp} (its KV-shared layers "
                             f"and per-layer inputs span the stages); allowed value is 1, use "
                             f"tensor_parallel_size to split it")
        dtype, h = torch.get_default_dtype(), config.hidden_size
        self.plans = layer_plans(config)
        self.residual_dtype = residual_dtype
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h)
        # transformers multiplies in the weights' dtype: sqrt(hidden) rounded to it.
        self.embed_scale = torch.tensor(h ** 0.5, dtype=dtype, device="cpu").item()
        self.per_layer_size = p = int(getattr(config, "hidden_size_per_layer_input", 0) or 0)
        if p:
            layers = config.num_hidden_layers
            self.embed_tokens_per_layer = VocabParallelEmbedding(config.vocab_size_per_layer_input, layers * p)
            self.per_layer_embed_scale = torch.tensor(p ** 0.5, dtype=dtype, device="cpu").item()
            self.per_layer_model_projection = ReplicatedLinear(h, layers * p, params_dtype=residual_dtype)
            self.projection_scale = h ** -0.5
            self.per_layer_projection_norm = Gemma4RMSNorm(p, config.rms_norm_eps, out_dtype=residual_dtype)
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(config, plan, attn_backend, rotary_emb, i, residual_dtype)
            for i, (plan, rotary_emb) in enumerate(zip(self.plans, _rotary_tables(config, self.plans))))
        self.norm = Gemma4RMSNorm(h, config.rms_norm_eps, out_dtype=dtype)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[T, layers, per_layer_size]: (norm(projection of the embeddings) + the per-layer
        embedding of each token) / sqrt(2), in the residual dtype."""
        shape = (input_ids.shape[0], len(self.layers), self.per_layer_size)
        token = self.embed_tokens_per_layer(input_ids) * self.per_layer_embed_scale
        projected = self.per_layer_model_projection(embeds) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.view(shape))
        return (projected + token.view(shape).to(self.residual_dtype)) * 2 ** -0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, final_norm: bool = True) -> torch.Tensor:
        """The final hidden states (model dtype), or with ``final_norm=False`` the residual stream
        before the final norm (residual dtype)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches must hold one cache per layer ({len(self.layers)}), got {len(kv_caches)}")
        h = self.embed_tokens(input_ids).to(self.residual_dtype) * self.embed_scale
        per_layer = self.per_layer_inputs(input_ids, h) if self.per_layer_size else None
        shared_kv: SharedKV = {}
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            h = layer(positions, h, kv_cache, attn_metadata, None if per_layer is None else per_layer[:, i],
                      shared_kv)
        return self.norm(h) if final_norm else h


# Checkpoint names of the MLP block's parts, which live under the layer's ``feed_forward`` here.
_FEED_FORWARD = ("mlp.", "pre_feedforward_layernorm.", "post_feedforward_layernorm_1.",
                 "pre_feedforward_layernorm_2.", "post_feedforward_layernorm_2.", "experts.")
_ROUTER = {"router.proj.": "experts.gate.", "router.scale": "router_scale",
           "router.per_expert_scale": "experts.expert_scales"}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


class Gemma4ForCausalLM(nn.Module):
    """Gemma4ForCausalLM: ``forward`` -> final hidden states, ``compute_logits`` -> logits,
    ``kv_cache_specs`` -> one cache spec per layer (this rank's KV heads)."""

    # Read by the worker: the piecewise graphs hand one attention shape between pieces in the
    # model dtype, and KV-shared layers attend to a cache they did not write in the step.
    piecewise_graphs_off = ("its layers differ in attention shape, share KV caches and keep the "
                            "residual stream in float32 under float16")

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None,
                 residual_dtype: torch.dtype | None = None, tie_word_embeddings: bool | None = None) -> None:
        super().__init__()
        self.config, self.dtype = hf_config, dtype
        # float16 cannot hold Gemma's residual stream (it grows past 65504): keep it in float32.
        self.residual_dtype = residual_dtype or (torch.float32 if dtype == torch.float16 else dtype)
        if self.residual_dtype != dtype:
            info_once(logger, "Gemma 4 in %s: residual stream and per-layer inputs in %s, blocks in %s",
                      str(dtype).removeprefix("torch."), str(self.residual_dtype).removeprefix("torch."),
                      str(dtype).removeprefix("torch."))
        if tie_word_embeddings is None:
            tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))
        self.tie_word_embeddings = tie_word_embeddings
        with default_dtype(dtype):
            self.model = Gemma4Model(hf_config, attn_backend, self.residual_dtype)
            with torch.device("meta") if tie_word_embeddings else contextlib.nullcontext():
                self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        if tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(
            hf_config.vocab_size, soft_cap=getattr(hf_config, "final_logit_softcapping", None))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, final_norm: bool = True) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata, final_norm)

    def compute_logits(self, hidden_states: torch.Tensor, apply_final_norm: bool = False) -> torch.Tensor:
        """Logits of final hidden states, or of residual-stream rows (``forward(final_norm=False)``)
        with ``apply_final_norm``."""
        if apply_final_norm:
            hidden_states = self.model.norm(hidden_states)
        return self.logits_processor(self.lm_head, hidden_states)

    def final_hidden(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Residual-stream rows (``forward(final_norm=False)``) -> final hidden states."""
        return self.model.norm(hidden_states)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """Per layer: a sliding-window or full-attention cache of its own head size and (this
        rank's) KV-head count, or the cache of the layer it shares."""
        specs: list[KVCacheSpec] = []
        for plan, layer in zip(self.model.plans, self.model.layers):
            attn = layer.self_attn.attn
            if plan.kv_source is not None:
                specs.append(SharedKVSpec(source=plan.kv_source))
            elif plan.sliding_window is not None:
                specs.append(SlidingWindowSpec(attn.num_kv_heads, attn.head_size, self.dtype,
                                               sliding_window=plan.sliding_window))
            else:
                specs.append(FullAttentionSpec(attn.num_kv_heads, attn.head_size, self.dtype))
        return specs

    def _our_names(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Checkpoint names -> ours: the MLP block under ``feed_forward``, the router's tensors,
        k_proj also as the v part of k_eq_v layers; KV-shared layers' unused k/v weights dropped."""
        for name, tensor in weights:
            match = _LAYER_NAME.fullmatch(name)
            if match is None or int(match[1]) >= len(self.model.plans):  # the loader names the stray
                yield name, tensor
                continue
            plan, rest = self.model.plans[int(match[1])], match[2]
            prefix = f"model.layers.{match[1]}."
            if rest.startswith("self_attn.") and plan.kv_source is not None:
                part = rest.split(".")[1]
                if part in ("k_proj", "v_proj", "k_norm", "v_norm"):
                    continue  # this layer reads its source layer's keys and values
                rest = rest.replace("self_attn.q_proj.", "self_attn.query_proj.")
            for old, new in _ROUTER.items():
                if rest.startswith(old):
                    rest = new + rest[len(old):]
            if rest.startswith(_FEED_FORWARD) or rest.startswith("router_scale"):
                rest = "feed_forward." + rest
            yield prefix + rest, tensor
            if plan.k_eq_v and rest.startswith("self_attn.k_proj."):
                yield prefix + rest.replace("k_proj", "v_proj"), tensor

    def _load_experts(self, name: str, tensor: torch.Tensor) -> str:
        """A stacked experts tensor (gate_up_proj [E, 2I, H] or down_proj [E, H, I]) into the
        layer's MoE; returns the parameter's name."""
        prefix = name.rsplit(".", 1)[0]
        moe = self.get_submodule(prefix)
        if tensor.dim() != 3 or tensor.shape[0] != moe.num_experts:
            raise ValueError(f"checkpoint weight {name!r} has shape {tuple(tensor.shape)}, expected "
                             f"[{moe.num_experts}, ...]")
        for e in range(moe.num_experts):
            if name.endswith("gate_up_proj"):
                gate, up = tensor[e].chunk(2, dim=0)
                moe.load_expert(e, "gate", gate)
                moe.load_expert(e, "up", up)
            else:
                moe.load_expert(e, "down", tensor[e])
        return f"{prefix}.{'w13' if name.endswith('gate_up_proj') else 'w2'}"

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; returns the names of the parameters that were filled."""
        loaded: set[str] = set()

        def dense() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in self._our_names(weights):
                if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
                    loaded.add(self._load_experts(name, tensor))
                else:
                    yield name, tensor

        loaded |= load_hf_weights(self, dense(), tie_word_embeddings=self.tie_word_embeddings)
        return loaded


# The hub's checkpoints keep the language model under "model.language_model." (transformers 5);
# the towers and their projections into the text embeddings are not served.
_SKIPPED_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                     "vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The language model of a Gemma 4 checkpoint (its ``text_config``); prompts are text only."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None,
                 residual_dtype: torch.dtype | None = None) -> None:
        warning_once(logger, "Gemma4ForConditionalGeneration: serving its language model; image, video and "
                     "audio inputs are not supported (the vision and audio towers are not loaded)")
        super().__init__(hf_config.text_config, dtype=dtype, attn_backend=attn_backend,
                         residual_dtype=residual_dtype,
                         tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(language_model_weights(weights, _SKIPPED_PREFIXES))
