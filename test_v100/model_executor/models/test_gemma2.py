"""Gemma 2 (four norms per layer, soft caps, alternating sliding-window layers) vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from vllm_volta.model_executor.models.registry import get_model_cls

from . import hf_compare
from .hf_compare import TINY, check_fp16_engine_logprobs, check_needed, hf_and_ours


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma2")
    # Layer 0 slides over 4 positions (the prompts are 9-21 long), layer 1 attends to all; soft
    # caps low enough to change the logits; an attention scale other than head_dim ** -0.5.
    config = transformers.Gemma2Config(**TINY, head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
                                       attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
    return hf_and_ours(config, folder)


def attn_impls(model):
    return [layer.self_attn.attn.impl for layer in model.model.layers]


def test_loaded_as_gemma2(models):
    hf, ours = models
    assert type(ours).__name__ == "Gemma2ForCausalLM"
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert ours.model.embed_scale == 8.0  # sqrt(64)
    layer, hf_layer = ours.model.layers[1], hf.model.layers[1]
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):
        torch.testing.assert_close(getattr(layer, name).weight, getattr(hf_layer, name).weight + 1)
    settings = [(impl.sliding_window, impl.logits_soft_cap, impl.scale) for impl in attn_impls(ours)]
    assert settings == [(4, 2.0, 24 ** -0.5), (None, 2.0, 24 ** -0.5)]
    assert ours.logits_processor.soft_cap == 3.0


@pytest.mark.parametrize("feature", ["sliding_window", "attn_soft_cap", "final_soft_cap"])
def test_each_feature_changes_the_logits(models, feature):
    hf, ours = models
    settings = {"sliding_window": [(impl, "sliding_window", None) for impl in attn_impls(ours)],
                "attn_soft_cap": [(impl, "logits_soft_cap", None) for impl in attn_impls(ours)],
                "final_soft_cap": [(ours.logits_processor, "soft_cap", None)]}
    check_needed(ours, hf, settings[feature])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    """As Gemma's test, with a sliding window (16) shorter than most prompts and soft caps (attention
    10, final 15) that the random weights' scores and logits exceed (without them transformers'
    logprobs move by more than 2)."""
    check_fp16_engine_logprobs(tmp_path, "gemma2", query_pre_attn_scalar=256, attn_logit_softcapping=10.0,
                               final_logit_softcapping=15.0)


@pytest.mark.parametrize("arch, config_cls, full_layers", [
    ("Gemma2ForCausalLM", transformers.Gemma2Config, [1, 3, 5]),
    ("Gemma3ForCausalLM", transformers.Gemma3TextConfig, [5])])
def test_layer_types_of_older_configs(arch, config_cls, full_layers):
    """transformers before 4.53 left layer_types out: Gemma 2 has every 2nd layer full, Gemma 3
    every 6th (its sliding_window_pattern)."""
    config = config_cls(**{**TINY, "num_hidden_layers": 7}, head_dim=16, sliding_window=4)
    config.layer_types = None
    model = get_model_cls(arch)(config, dtype=torch.float32)
    windows = [layer.self_attn.attn.impl.sliding_window for layer in model.model.layers]
    assert windows == [None if i in full_layers else 4 for i in range(7)]
