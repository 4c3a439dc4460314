"""Llama / Mistral vs transformers on random weights, through the paged KV cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from vllm_volta.model_executor.models.utils import layer_sliding_window

from .hf_compare import (TINY, check_fp16_decode_fusions, check_mixed_batch, check_needed, check_single_prefill,
                         load_ours, save_random_hf_model)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _configs() -> dict[str, transformers.PretrainedConfig]:
    return {
        # Llama 3.x: GQA + llama3 rope scaling whose bands fall inside the tested positions.
        "llama3": transformers.LlamaConfig(**TINY, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
        # SmolLM2-like: tied embeddings, MHA, head_dim given explicitly; saved sharded.
        "tied": transformers.LlamaConfig(**{**TINY, "num_key_value_heads": 4}, head_dim=16,
                                         tie_word_embeddings=True),
        "mistral": transformers.MistralConfig(**TINY, sliding_window=4096),
        # A window shorter than the prompts (9-21 tokens), in every layer as in Mistral v0.1.
        "mistral_window": transformers.MistralConfig(**TINY, sliding_window=5),
    }


@pytest.fixture(scope="module", params=["llama3", "tied", "mistral", "mistral_window"])
def models(request, tmp_path_factory):
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    shard = "40KB" if name == "tied" else None
    hf = save_random_hf_model(_configs()[name], folder, max_shard_size=shard)
    if name == "tied":
        assert (folder / "model.safetensors.index.json").exists()
    return hf, load_ours(folder)


def test_model_class(models):
    hf, ours = models
    expected = {"LlamaForCausalLM": "LlamaForCausalLM", "MistralForCausalLM": "MistralForCausalLM"}
    assert type(ours).__name__ == expected[hf.config.architectures[0]]
    if hf.config.tie_word_embeddings:
        assert ours.lm_head.weight is ours.model.embed_tokens.weight


def test_sliding_window(models):
    hf, ours = models
    windows = [layer.self_attn.attn.impl.sliding_window for layer in ours.model.layers]
    assert windows == [getattr(hf.config, "sliding_window", None)] * len(windows)
    if hf.config.architectures == ["MistralForCausalLM"] and hf.config.sliding_window == 5:
        # Attending over all positions changes the logits: transformers applies the window too.
        check_needed(ours, hf, [(layer.self_attn.attn.impl, "sliding_window", None)
                                for layer in ours.model.layers])


def test_layer_sliding_window():
    v01 = SimpleNamespace(sliding_window=4096)  # Mistral v0.1: every layer
    assert [layer_sliding_window(v01, i) for i in range(2)] == [4096, 4096]
    assert layer_sliding_window(SimpleNamespace(sliding_window=None), 0) is None
    old_qwen2 = SimpleNamespace(sliding_window=32768, use_sliding_window=False)
    assert layer_sliding_window(old_qwen2, 0) is None
    typed = SimpleNamespace(sliding_window=512, layer_types=["sliding_attention", "full_attention"])
    assert [layer_sliding_window(typed, i) for i in range(2)] == [512, None]


def test_single_prefill_matches_transformers(models):
    hf, ours = models
    check_single_prefill(ours, hf)


def test_mixed_batch_matches_transformers(models):
    hf, ours = models
    check_mixed_batch(ours, hf)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixed_batch_on_gpu(models, tmp_path):
    hf, _ = models
    hf.save_pretrained(tmp_path)
    ours = load_ours(tmp_path, device="cuda")
    check_mixed_batch(ours, hf, device="cuda", atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_decode_fusions_on_gpu(models, tmp_path, monkeypatch):
    check_fp16_decode_fusions(models[0], tmp_path, monkeypatch)
