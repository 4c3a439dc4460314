"""Model registry: HF architecture name -> model class (imported on first use)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

# architecture -> (module under vllm_volta.model_executor.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("gemma3", "Gemma3ForConditionalGeneration"),
    "Gemma4ForCausalLM": ("gemma4", "Gemma4ForCausalLM"),
    "Gemma4ForConditionalGeneration": ("gemma4", "Gemma4ForConditionalGeneration"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
}


def get_supported_archs() -> list[str]:
    """Architecture names (as in config.json "architectures") that can be served."""
    return sorted(_MODELS)


def get_model_cls(architectures: Sequence[str] | str | None) -> type:
    """The class for the first supported name in ``architectures``; ValueError when none is."""
    if isinstance(architectures, str):
        architectures = [architectures]
    archs = list(architectures or [])
    for arch in archs:
        if arch in _MODELS:
            module_name, cls_name = _MODELS[arch]
            module = importlib.import_module(f"vllm_volta.model_executor.models.{module_name}")
            return getattr(module, cls_name)
    raise ValueError(f"Model architectures {archs} are not supported; supported architectures: "
                     f"{', '.join(get_supported_archs())}")
