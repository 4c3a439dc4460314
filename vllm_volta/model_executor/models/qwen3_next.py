"""Qwen3-Next (``Qwen3NextForCausalLM``): a hybrid decoder, three Gated DeltaNet layers
(linear attention with a recurrent state, layers/gated_delta_net.py) to one gated full-attention
layer (``layer_types`` / ``full_attention_interval``), with mixture-of-experts MLPs.

The full-attention layer: q_proj yields each head's query and its output gate side by side
([q_h | gate_h]); per-head q/k RMSNorms; RoPE on the first ``partial_rotary_factor`` of each
head; paged attention; the output times sigmoid(gate), then o_proj. Every RMSNorm outside the
DeltaNet scales by (1 + weight): the 1 is added at load. The MoE block: softmax top-k routing
plus a shared expert scaled by sigmoid(shared_expert_gate(x)).

Qwen3.5 (qwen3_5.py) is the same decoder with its DeltaNet projections stored separately.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, KVCacheSpec
from vllm_volta.logger import init_logger
from vllm_volta.model_executor.layers.gated_delta_net import GatedDeltaNet
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm_volta.model_executor.layers.logits import LogitsProcessor
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.pipeline_stage import PipelineStage, is_pp_missing
from vllm_volta.model_executor.layers.rotary_embedding import get_rope, rope_params_from_config
from vllm_volta.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm_volta.model_executor.models.llama import LlamaMLP
from vllm_volta.model_executor.models.mixtral import MixtralForCausalLM
from vllm_volta.model_executor.models.qwen2_moe import SharedExpertMoE
from vllm_volta.model_executor.models.utils import config_head_dim, default_dtype

logger = init_logger(__name__)

# Norms that scale by (1 + weight); the DeltaNet's gated norm (linear_attn.norm) scales by weight.
_OFFSET_NORMS = re.compile(r"(^model\.norm|layernorm|self_attn\.[qk]_norm)\.weight$")
# Experts stored stacked (transformers' layout): gate_up_proj [E, 2I, H], down_proj [E, H, I].
_STACKED_EXPERTS = re.compile(r"^(.*)\.experts\.(gate_up_proj|down_proj)$")
_LINEAR_ATTN = re.compile(r"^(model\.layers\.\d+\.linear_attn)\.(.+)$")


class GatedAttention(nn.Module):
    """Full attention with a sigmoid output gate, per-head (1 + w) q/k norms, partial RoPE."""

    def __init__(self, config: Any, attn_backend: type | None, rotary_emb: nn.Module) -> None:
        super().__init__()
        self.head_dim = config_head_dim(config)
        bias = bool(getattr(config, "attention_bias", False))
        # q_proj's rows are [q_h | gate_h] per head: as 2 * num_heads "heads" they shard by head.
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, 2 * config.num_attention_heads,
                                          config.num_key_value_heads, bias=bias)
        self.num_heads = self.qkv_proj.num_heads // 2
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size, bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              self.qkv_proj.num_kv_heads, attn_backend)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        q_gate, k, v = self.qkv_proj(x).split([self.qkv_proj.q_size, self.qkv_proj.kv_size,
                                               self.qkv_proj.kv_size], dim=-1)
        q, gate = q_gate.reshape(n, self.num_heads, 2 * d).split(d, dim=-1)
        q = self.q_norm(q.reshape(-1, d)).view(n, -1)
        k = self.k_norm(k.reshape(-1, d)).view(n, -1)
        out = self.attn(q, k, v, kv_cache, attn_metadata, rope=(self.rotary_emb, positions))
        return self.o_proj(out * torch.sigmoid(gate.reshape(n, -1)))


class HybridDecoderLayer(nn.Module):
    """Pre-norm token mixer (``linear_attn``: Gated DeltaNet, or ``self_attn``: gated attention)
    and MLP, each added to the residual stream."""

    def __init__(self, config: Any, layer_idx: int, attn_backend: type | None, rotary_emb: nn.Module,
                 mlp: nn.Module) -> None:
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
        elif self.layer_type == "full_attention":
            self.self_attn = GatedAttention(config, attn_backend, rotary_emb)
        else:
            raise ValueError(f"layer_types[{layer_idx}] must be 'linear_attention' or 'full_attention', "
                             f"got {self.layer_type!r}")
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                cache: Any, attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.layer_type == "linear_attention":
            hidden_states = self.linear_attn(hidden_states, cache, attn_metadata)
        else:
            hidden_states = self.self_attn(positions, hidden_states, cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class HybridModel(nn.Module):
    """Embedding, hybrid decoder layers, final norm (LlamaModel's interface)."""

    def __init__(self, config: Any, attn_backend: type | None, make_mlp: Any,
                 tie_word_embeddings: bool = False) -> None:
        super().__init__()
        head_dim = config_head_dim(config)
        rope = getattr(config, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        theta, scaling = rope_params_from_config(config)
        # M-RoPE's sections all see the same position for text, so it is plain RoPE here.
        rotary_emb = get_rope(head_dim, int(head_dim * factor), config.max_position_embeddings, theta,
                              is_neox_style=True, rope_scaling=scaling)
        # Pipeline parallelism: this stage's layers only (a tied LM head keeps the embeddings).
        self.pp = pp = PipelineStage(config.num_hidden_layers, config.hidden_size)
        self.embed_tokens = pp.here(lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size),
                                    on_first=True, on_last=tie_word_embeddings)
        self.layers = pp.make_layers(config.num_hidden_layers, lambda i: HybridDecoderLayer(
            config, i, attn_backend, rotary_emb, make_mlp(config, i)))
        self.norm = pp.here(lambda: RMSNorm(config.hidden_size, config.rms_norm_eps), on_last=True)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[Any],
                attn_metadata: AttentionMetadata, final_norm: bool = True) -> torch.Tensor:
        pp = self.pp
        pp.check_caches(kv_caches)
        if pp.is_first:
            hidden_states, residual = self.embed_tokens(input_ids), None
        else:
            hidden_states, residual = pp.receive(input_ids.shape[0], input_ids.device)
        for layer, cache in zip(pp.layers(self.layers), kv_caches):
            hidden_states, residual = layer(positions, hidden_states, residual, cache, attn_metadata)
        if not pp.is_last:  # the next stage continues (LlamaModel's contract)
            return pp.send(hidden_states, residual)
        if not final_norm:
            return hidden_states + residual
        return self.norm(hidden_states, residual)[0]


class Qwen3NextForCausalLM(MixtralForCausalLM):
    """Qwen3NextForCausalLM. ``kv_cache_specs()``: per layer, this rank's paged KV
    (full attention) or recurrent state (Gated DeltaNet, GatedDeltaNet.state_spec)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type | None = None,
                 tie_word_embeddings: bool | None = None) -> None:
        nn.Module.__init__(self)
        self.config = hf_config
        self.dtype = dtype
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False)
                                        if tie_word_embeddings is None else tie_word_embeddings)
        with default_dtype(dtype):
            self.model = HybridModel(hf_config, attn_backend, self.make_mlp, self.tie_word_embeddings)
            # A tied head's own weight is never used: build it on "meta" (no memory), then tie.
            with torch.device("meta") if self.tie_word_embeddings else contextlib.nullcontext():
                self.lm_head = self.model.pp.here(
                    lambda: ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size), on_last=True)
        if self.tie_word_embeddings and self.model.pp.is_last:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(hf_config.vocab_size)
        kinds = [layer.layer_type for layer in self.model.pp.layers(self.model.layers)]
        logger.info("%s: %d Gated DeltaNet layers (recurrent state %s), %d full-attention layers",
                    type(self).__name__, kinds.count("linear_attention"),
                    str(self.model.layers[self.model.pp.start + kinds.index("linear_attention")].linear_attn.state_dtype)
                    if "linear_attention" in kinds else "-", kinds.count("full_attention"))

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        """A MoE block unless the layer is in ``mlp_only_layers`` or off ``decoder_sparse_step``."""
        step = getattr(config, "decoder_sparse_step", 1) or 1
        if (layer_idx in (getattr(config, "mlp_only_layers", None) or []) or config.num_experts <= 0
                or (layer_idx + 1) % step):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        return SharedExpertMoE(config, renormalize=bool(getattr(config, "norm_topk_prob", True)))

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        specs: list[KVCacheSpec] = []
        for layer in self.model.pp.layers(self.model.layers):
            if layer.layer_type == "linear_attention":
                specs.append(layer.linear_attn.state_spec(self.dtype))
            else:
                attn = layer.self_attn.attn
                specs.append(FullAttentionSpec(attn.num_kv_heads, attn.head_size, self.dtype))
        return specs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """HF-named tensors: the DeltaNet's and stacked experts' here, the rest as Mixtral's
        (per-expert tensors) and Llama's; (1 + w) norms get their 1."""
        loaded: set[str] = set()
        loaded |= super().load_weights(self._own_weights(self._text_weights(weights), loaded))
        return loaded

    def _text_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The language model's tensors under this class's names (image-text checkpoints keep
        them under ``model.language_model.``); the multi-token-prediction head is not loaded."""
        skipped = 0
        for name, tensor in weights:
            if name.startswith(("mtp.", "model.mtp.", "model.visual.", "visual.")):
                skipped += 1
                continue
            yield name.replace("model.language_model.", "model.", 1), tensor
        if skipped:
            logger.info("%s: %d checkpoint tensors of the vision tower / multi-token prediction not loaded "
                        "(text generation uses neither)", type(self).__name__, skipped)

    def _own_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                     loaded: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if _OFFSET_NORMS.search(name):
                yield name, tensor.float() + 1.0
            elif (match := _LINEAR_ATTN.match(name) or _STACKED_EXPERTS.match(name)) and is_pp_missing(
                    self, match.group(1)):
                continue  # another pipeline stage's layer
            elif match := _LINEAR_ATTN.match(name):
                layer = self._submodule(name, match.group(1))
                loaded.update(f"{match.group(1)}.{p}" for p in layer.load_hf_weight(match.group(2), tensor))
            elif match := _STACKED_EXPERTS.match(name):
                moe = self._submodule(name, match.group(1))
                if not isinstance(moe, MoE) or tensor.shape[0] != moe.num_experts:
                    raise ValueError(f"checkpoint weight {name!r} with shape {tuple(tensor.shape)} does not fit "
                                     f"{match.group(1)} (a MoE block with one entry per expert)")
                for expert, part in enumerate(tensor):
                    if match.group(2) == "down_proj":
                        moe.load_expert(expert, "down", part)
                    else:
                        gate, up = part.chunk(2, dim=0)
                        moe.load_expert(expert, "gate", gate)
                        moe.load_expert(expert, "up", up)
                loaded.add(f"{match.group(1)}.{'w2' if match.group(2) == 'down_proj' else 'w13'}")
            else:
                yield name, tensor

    def _submodule(self, name: str, path: str) -> nn.Module:
        try:
            return self.get_submodule(path)
        except AttributeError:
            raise ValueError(f"checkpoint weight {name!r} does not belong to {type(self).__name__} "
                             f"(no module {path!r})") from None
