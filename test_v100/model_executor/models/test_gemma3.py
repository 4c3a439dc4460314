"""Gemma 3 text (Gemma 2 with per-head q/k norms and a RoPE table per layer type) vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from vllm_volta.model_executor.layers.rotary_embedding import LinearScalingRotaryEmbedding

from . import hf_compare
from .hf_compare import (TINY, check_fp16_engine_logprobs, check_needed, check_single_prefill, hf_and_ours,
                         load_ours)

ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3")
    # Sliding layers (window 4: the prompts are 9-21 long) on both sides of a full one.
    config = transformers.Gemma3TextConfig(
        **{**TINY, "num_hidden_layers": 3}, head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_parameters=ROPE)
    return hf_and_ours(config, folder)


def test_loaded_as_gemma3(models):
    hf, ours = models
    assert type(ours).__name__ == "Gemma3ForCausalLM"
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    attn, hf_attn = ours.model.layers[1].self_attn, hf.model.layers[1].self_attn
    torch.testing.assert_close(attn.q_norm.weight, hf_attn.q_norm.weight + 1)
    torch.testing.assert_close(attn.k_norm.weight, hf_attn.k_norm.weight + 1)
    layers = [layer.self_attn for layer in ours.model.layers]
    settings = [(a.attn.impl.sliding_window, a.attn.impl.logits_soft_cap) for a in layers]
    assert settings == [(4, None), (None, None), (4, None)]
    assert ours.logits_processor.soft_cap is None
    # One table per layer type, shared by the layers of that type.
    sliding, full = layers[0].rotary_emb, layers[1].rotary_emb
    assert layers[2].rotary_emb is sliding and type(sliding).__name__ == "RotaryEmbedding"
    assert sliding.base == 10000.0
    assert isinstance(full, LinearScalingRotaryEmbedding) and (full.base, full.factor) == (1e6, 8.0)


@pytest.mark.parametrize("feature", ["sliding_window", "full_layer_rope"])
def test_each_feature_changes_the_logits(models, feature):
    hf, ours = models
    layers = [layer.self_attn for layer in ours.model.layers]
    settings = {"sliding_window": [(a.attn.impl, "sliding_window", None) for a in layers],
                "full_layer_rope": [(layers[1], "rotary_emb", layers[0].rotary_emb)]}
    check_needed(ours, hf, settings[feature])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    """As Gemma's test: a sliding layer (window 16, shorter than most prompts) and a full one, each
    with its own RoPE table, and the per-head q/k norms."""
    check_fp16_engine_logprobs(tmp_path, "gemma3", query_pre_attn_scalar=256)


def test_image_text_checkpoint_serves_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint (as the 4B-27B ship): its text_config's model,
    the language-model weights only, logits equal to transformers' on text-only input."""
    text = transformers.Gemma3TextConfig(
        **{**TINY, "num_hidden_layers": 2}, head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention"], rope_parameters=ROPE)
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.15)
    hf.save_pretrained(tmp_path)
    ours = load_ours(tmp_path)
    assert type(ours).__name__ == "Gemma3ForConditionalGeneration"
    assert not any("vision" in name for name, _ in ours.named_parameters())
    check_single_prefill(ours, hf)


def test_image_text_weight_names_of_both_layouts():
    from vllm_volta.model_executor.models.gemma3 import _SKIPPED_PREFIXES
    from vllm_volta.model_executor.models.utils import language_model_weights

    t = torch.zeros(1)
    names = ["language_model.model.layers.0.mlp.down_proj.weight", "language_model.lm_head.weight",
             "vision_tower.vision_model.embeddings.patch_embedding.weight", "multi_modal_projector.mm_soft_emb_norm.weight",
             "model.language_model.norm.weight", "model.vision_tower.vision_model.post_layernorm.weight",
             "model.multi_modal_projector.mm_input_projection_weight", "lm_head.weight"]
    assert [n for n, _ in language_model_weights(((n, t) for n in names), _SKIPPED_PREFIXES)] == [
        "model.layers.0.mlp.down_proj.weight", "lm_head.weight", "model.norm.weight", "lm_head.weight"]
