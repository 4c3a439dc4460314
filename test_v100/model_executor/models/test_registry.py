from __future__ import annotations

import pytest

from vllm_volta.model_executor.models.registry import get_model_cls, get_supported_archs


def test_known_architectures():
    assert get_supported_archs() == ["Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
                                     "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "GemmaForCausalLM", "GraniteForCausalLM",
                                     "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
                                     "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM",
                                     "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
                                     "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
                                     "Qwen3_5MoeForConditionalGeneration"]
    for arch in get_supported_archs():
        assert get_model_cls([arch]).__name__ == arch
    # The first supported name wins; a plain string works too.
    assert get_model_cls(["Foo", "Qwen2ForCausalLM"]).__name__ == "Qwen2ForCausalLM"
    assert get_model_cls("MistralForCausalLM").__name__ == "MistralForCausalLM"


@pytest.mark.parametrize("archs", [["GPT2LMHeadModel"], [], None])
def test_unknown_architecture_lists_supported(archs):
    with pytest.raises(ValueError, match="supported architectures: Gemma2ForCausalLM, Gemma3ForCausalLM, "
                                         "Gemma3ForConditionalGeneration, Gemma4ForCausalLM, "
                                         "Gemma4ForConditionalGeneration, GemmaForCausalLM, GraniteForCausalLM, LlamaForCausalLM, "
                                         "MistralForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, "
                                         "Qwen2MoeForCausalLM, "
                                         "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM, "
                                         "Qwen3_5ForConditionalGeneration, Qwen3_5MoeForCausalLM, "
                                         "Qwen3_5MoeForConditionalGeneration"):
        get_model_cls(archs)
