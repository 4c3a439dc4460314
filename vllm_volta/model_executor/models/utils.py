"""Helpers shared by the model classes: dtype scoping, HF-name weight loading, config reading."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from vllm_volta.attention.kv_cache_dtype import load_kv_scale
from vllm_volta.model_executor.layers.linear import default_weight_loader
from vllm_volta.model_executor.layers.pipeline_stage import is_pp_missing

# (fused parameter, HF checkpoint module, shard id): q/k/v -> qkv_proj, gate/up -> gate_up_proj.
STACKED_PARAMS_MAPPING: list[tuple[str, str, Any]] = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]
# Buffers some checkpoints store that we recompute.
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters in ``dtype`` inside the block."""
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_hf_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                    tie_word_embeddings: bool = False,
                    stacked_params_mapping: list[tuple[str, str, Any]] = STACKED_PARAMS_MAPPING
                    ) -> set[str]:
    """Load HF-named tensors into ``model``; returns the names of fully loaded parameters.

    A fused parameter counts as loaded only once every shard of it was seen. A checkpoint name
    that matches no parameter raises ValueError.
    """
    params = dict(model.named_parameters())
    expected_shards: dict[str, set[Any]] = {}
    for fused, _, shard_id in stacked_params_mapping:
        expected_shards.setdefault(fused, set()).add(shard_id)
    seen_shards: dict[str, set[Any]] = {}
    loaded: set[str] = set()
    # GPTQ's g_idx is read by layers in activation order only (others use row k // group_size).
    takes_g_idx = any(n.endswith(".g_idx") for n in params)
    for name, tensor in weights:
        if name.endswith(_SKIPPED_SUFFIXES) or (name.endswith(".g_idx") and not takes_g_idx):
            continue
        if load_kv_scale(model, name, tensor):  # an FP8 checkpoint's per-layer k / v scale
            continue
        if tie_word_embeddings and name.startswith("lm_head."):
            continue  # the head shares embed_tokens' weight
        for fused, shard_name, shard_id in stacked_params_mapping:
            if shard_name not in name:
                continue
            target = name.replace(shard_name, fused)
            param = _lookup(params, target, name, model)
            if param is None:
                break
            _call_loader(name, param.weight_loader, param, tensor, shard_id)
            seen_shards.setdefault(target, set()).add(shard_id)
            if seen_shards[target] == expected_shards[fused]:
                loaded.add(target)
            break
        else:
            param = _lookup(params, name, name, model)
            if param is None:
                continue
            _call_loader(name, getattr(param, "weight_loader", default_weight_loader),
                         param, tensor)
            loaded.add(name)
    return loaded


def _call_loader(name: str, loader: Any, *args: Any) -> None:
    try:
        loader(*args)
    except ValueError as e:  # name the checkpoint tensor in shape errors
        raise ValueError(f"checkpoint weight {name!r}: {e}") from e


def _lookup(params: dict[str, nn.Parameter], target: str, name: str,
            model: nn.Module) -> nn.Parameter | None:
    """The parameter ``target``; None where another pipeline stage holds it (skipped)."""
    param = params.get(target)
    if param is None and is_pp_missing(model, target):
        return None
    if param is None:
        raise ValueError(f"checkpoint weight {name!r} does not belong to "
                         f"{type(model).__name__} (no parameter {target!r})")
    return param


def config_head_dim(hf_config: Any) -> int:
    """Per-head size: ``head_dim`` when the config gives it, else hidden_size / num_heads. Where
    layers differ (Gemma 4's full layers have their own), the largest: the attention backend
    must run every layer."""
    if varies_by_layer(hf_config, "head_dim"):
        return max(layer_head_dim(hf_config, i) for i in range(hf_config.num_hidden_layers))
    head_dim = getattr(hf_config, "head_dim", None)
    return int(head_dim) if head_dim else hf_config.hidden_size // hf_config.num_attention_heads


def varies_by_layer(hf_config: Any, name: str) -> bool:
    """Whether ``name`` varies by layer in a heterogeneous transformers config (reading it off
    the config itself then raises)."""
    return bool(getattr(hf_config, "is_heterogeneous", False)
                and name in (getattr(hf_config, "per_layer_attributes", None) or ()))


def layer_config_value(hf_config: Any, layer_idx: int, name: str, default: Any = None) -> Any:
    """``name`` as layer ``layer_idx`` sees it: its per-layer override in a heterogeneous config
    (transformers' ``per_layer_config``), else the config's value."""
    if varies_by_layer(hf_config, name):
        return getattr(hf_config.per_layer_config[layer_idx], name, default)
    return getattr(hf_config, name, default)


def layer_head_dim(hf_config: Any, layer_idx: int) -> int:
    """Layer ``layer_idx``'s head size (config_head_dim's rule, per layer)."""
    head_dim = layer_config_value(hf_config, layer_idx, "head_dim")
    return int(head_dim) if head_dim else hf_config.hidden_size // hf_config.num_attention_heads


def layer_sliding_window(hf_config: Any, layer_idx: int) -> int | None:
    """The sliding window of layer ``layer_idx``'s attention, None for full attention.

    With ``layer_types`` (transformers 5 fills it) only "sliding_attention" layers have one;
    without, every layer has the config's window unless ``use_sliding_window`` is False (older
    Qwen2 configs; Mistral v0.1 has a window of 4096 and no such flag)."""
    window = getattr(hf_config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return int(window) if layer_types[layer_idx] == "sliding_attention" else None
    return None if getattr(hf_config, "use_sliding_window", None) is False else int(window)


def language_model_weights(weights: Iterable[tuple[str, torch.Tensor]], skipped_prefixes: tuple[str, ...]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
    """An image-text checkpoint's language-model tensors under the text model's names
    (``model.language_model.X`` / ``language_model.model.X`` -> ``model.X``,
    ``language_model.lm_head`` -> ``lm_head``); tensors under ``skipped_prefixes`` (the other
    towers) are left out."""
    for name, tensor in weights:
        if name.startswith(skipped_prefixes):
            continue
        for prefix in ("model.language_model.", "language_model.model."):
            if name.startswith(prefix):
                name = "model." + name[len(prefix):]
                break
        yield name.removeprefix("language_model."), tensor

