"""Bytes a decode step moves, from the model shape alone: the denominator of the memory roofline.

A decode step of B sequences reads every weight once, except that a mixture-of-experts layer reads
only the experts its tokens route to (the expected number of distinct experts when B * top_k
choices fall uniformly on E experts: E * (1 - (1 - k / E) ** B)); it reads each sequence's KV cache
(full-attention layers: the whole context; sliding-window layers: at most the window) and reads
and writes each sequence's recurrent state (linear-attention layers: the float32 delta-rule state
and the conv state); a layer reading another layer's cache (Gemma 4's KV sharing) counts its
reads too. The context grows by one token a step: the mean over a run's decode steps is
counted (input_len + (output_len - 1) / 2 tokens). Quantized experts count their format's bytes:
4-bit (AWQ / GPTQ / compressed-tensors) half a byte per weight plus a scale in the dtype and a
4-bit zero per group, FP8 one byte.
"""
from __future__ import annotations

from typing import Any

import torch

from benchmarks.utils import weight_bytes_per_token


def _layer_values(cfg: Any, name: str, default: Any) -> list[Any]:
    layers = getattr(cfg, "per_layer_config", None)
    values = [getattr(layer, name, None) for layer in layers] if layers else []
    if values and all(v is not None for v in values):
        return values
    return [getattr(cfg, name, None) or default] * cfg.num_hidden_layers


def _expert_bytes_per_param(hf_config: Any, elt: int) -> float:
    """Bytes a decode step reads per routed-expert weight in this checkpoint's format."""
    from vllm_volta.model_executor.layers.quantization import get_quant_config
    from vllm_volta.model_executor.layers.quantization.moe_quant import make_moe_quant_method

    method = make_moe_quant_method(get_quant_config(hf_config))
    if method is None:
        return float(elt)
    if method.kind == "fp8":
        return 1.0
    return 0.5 + ((elt + 0.5) / method.group_size if method.group_size > 0 else 0.0)


def _expert_params(hf_config: Any) -> tuple[int, int, int, int]:
    """(expert parameters, experts, top_k, those of them in nn.Linear modules) of the model;
    zeros for a dense model."""
    from transformers import AutoModelForCausalLM

    experts = (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)
    top_k = getattr(hf_config, "num_experts_per_tok", None) or getattr(hf_config, "top_k_experts", None) or 0
    if not experts or not top_k:
        return 0, 0, 0, 0
    if getattr(hf_config, "quantization_config", None) is not None:  # the float model of the same shape
        import copy
        hf_config = copy.deepcopy(hf_config)
        del hf_config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for name, p in model.named_parameters()
                 if ".experts." in name and "shared_expert" not in name)
    linear = sum(m.weight.numel() for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and ".experts." in name and "shared_expert" not in name)
    return params, experts, top_k, linear


def decode_bytes_per_step(hf_config: Any, dtype: torch.dtype, batch_size: int, input_len: int,
                          output_len: int) -> dict[str, float]:
    """Weights (active experts only), KV cache and recurrent state moved by a mean decode step."""
    cfg = getattr(hf_config, "text_config", None) or hf_config
    elt = torch.empty((), dtype=dtype).element_size()
    weights = weight_bytes_per_token(hf_config, dtype)["weight_bytes_per_token"]
    expert_params, experts, top_k, linear = _expert_params(hf_config)
    if expert_params:
        per_param = _expert_bytes_per_param(hf_config, elt)
        # weight_bytes_per_token counts quantized nn.Linear weights packed, fused expert tensors at elt
        weights -= (expert_params - linear) * (elt - per_param)
        used = experts * (1 - (1 - top_k / experts) ** batch_size)
        weights -= expert_params * per_param * (1 - used / experts)
    context = input_len + (output_len - 1) / 2
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = _layer_values(cfg, "num_key_value_heads", heads)
    head_dims = _layer_values(cfg, "head_dim", cfg.hidden_size // heads)
    window = getattr(cfg, "sliding_window", None)
    kv = state = 0.0
    for i, kind in enumerate(types):
        if kind == "linear_attention":
            v_heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
            conv = (2 * cfg.linear_num_key_heads * dk + v_heads * dv) * (cfg.linear_conv_kernel_dim - 1)
            state += 2 * (v_heads * dk * dv * 4 + conv * elt)  # read and written
            continue
        tokens = min(context, window) if kind == "sliding_attention" and window else context
        kv += tokens * 2 * kv_heads[i] * head_dims[i] * elt
    return {"weight_bytes_per_step": weights, "kv_bytes_per_step": batch_size * kv,
            "state_bytes_per_step": batch_size * state,
            "bytes_per_step": weights + batch_size * (kv + state)}
