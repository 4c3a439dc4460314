"""Gemma 4's per-layer settings, read once from its text config.

Gemma 4 layers differ in more than the sliding window: the full-attention layers have their own
head size (512 where the sliding ones have 256) and, in the checkpoints with
``attention_k_eq_v``, their own KV-head count and keys that double as values; the last
``num_kv_shared_layers`` layers compute no keys or values and read the cache of the last earlier
layer of their type; those layers' MLPs are twice as wide where ``use_double_wide_mlp`` says so.

transformers 5 keeps the per-layer head size and KV-head count in ``per_layer_config`` (reading
``config.head_dim`` itself then raises); configs written before that carry ``global_head_dim`` /
``num_global_key_value_heads`` beside the sliding layers' values. Both are read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_volta.model_executor.models.utils import (varies_by_layer, layer_config_value, layer_head_dim,
                                                    layer_sliding_window)

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma4LayerPlan:
    """What one decoder layer is."""

    layer_type: str  # "sliding_attention" or "full_attention"
    head_dim: int
    num_kv_heads: int  # in the whole model (before tensor parallelism)
    sliding_window: int | None
    k_eq_v: bool  # the key projection's output is also the value (no v_proj)
    kv_source: int | None  # the layer whose cache this one reads (KV-shared layers), else None
    stores_kv: bool  # a later layer reads this layer's keys and values
    double_wide_mlp: bool


def _head_dim(config: Any, layer_idx: int, layer_type: str) -> int:
    if layer_type == FULL and not varies_by_layer(config, "head_dim") and getattr(config, "global_head_dim", None):
        return int(config.global_head_dim)  # a config without per_layer_config
    return layer_head_dim(config, layer_idx)


def _num_kv_heads(config: Any, layer_idx: int, layer_type: str, k_eq_v: bool) -> int:
    # As transformers: full layers have their own KV-head count only in k_eq_v checkpoints.
    if (layer_type == FULL and k_eq_v and not varies_by_layer(config, "num_key_value_heads")
            and getattr(config, "num_global_key_value_heads", None)):
        return int(config.num_global_key_value_heads)
    return int(layer_config_value(config, layer_idx, "num_key_value_heads") or config.num_attention_heads)


def layer_plans(config: Any) -> list[Gemma4LayerPlan]:
    """One plan per decoder layer of a Gemma 4 text config."""
    num_layers = config.num_hidden_layers
    layer_types = list(getattr(config, "layer_types", None) or [])
    if len(layer_types) != num_layers or not set(layer_types) <= {SLIDING, FULL}:
        raise ValueError(f"layer_types must list {num_layers} entries, each 'sliding_attention' or "
                         f"'full_attention', got {layer_types!r}")
    if getattr(config, "use_bidirectional_attention", None) == "all":
        raise ValueError("use_bidirectional_attention='all' (an encoder) is not supported; allowed: "
                         "None or 'vision' (causal text)")
    num_shared = int(getattr(config, "num_kv_shared_layers", 0) or 0)
    first_shared = num_layers - num_shared
    if not 0 <= num_shared < num_layers:
        raise ValueError(f"num_kv_shared_layers must be in [0, {num_layers - 1}], got {num_shared}")
    sources: dict[int, int] = {}
    for i in range(first_shared, num_layers):
        earlier = [j for j in range(first_shared) if layer_types[j] == layer_types[i]]
        if not earlier:
            raise ValueError(f"layer {i} ({layer_types[i]}) shares keys/values, but no earlier layer "
                             "of that type computes them (num_kv_shared_layers too large)")
        sources[i] = earlier[-1]
    k_eq_v = bool(getattr(config, "attention_k_eq_v", False))
    double_wide = bool(getattr(config, "use_double_wide_mlp", False))
    plans = []
    for i, layer_type in enumerate(layer_types):
        plans.append(Gemma4LayerPlan(
            layer_type=layer_type,
            head_dim=_head_dim(config, i, layer_type),
            num_kv_heads=_num_kv_heads(config, i, layer_type, k_eq_v),
            sliding_window=layer_sliding_window(config, i),
            k_eq_v=k_eq_v and layer_type == FULL,
            kv_source=sources.get(i),
            stores_kv=i in sources.values(),
            double_wide_mlp=double_wide and i in sources,
        ))
    return plans
