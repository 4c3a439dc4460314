"""load_gguf_config / open_gguf on the real default model (synthetic files: test_gguf_synthetic)."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config, open_gguf

# HuggingFaceTB/SmolLM2-135M-Instruct's published config.json.
_SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "attention_bias": False,
}


def test_default_model_config_matches_published_config(default_model_path):
    config = load_gguf_config(default_model_path)
    assert isinstance(config, LlamaConfig)
    assert config.architectures == ["LlamaForCausalLM"]
    for key, value in _SMOLLM2_135M.items():
        assert getattr(config, key) == value, key
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    assert theta == 100000.0
    scaling = config.rope_scaling
    assert scaling is None or scaling.get("rope_type", "default") == "default"


def test_open_gguf_parses_once_and_reports_torch_shapes(default_model_path):
    first = open_gguf(default_model_path)
    assert open_gguf(str(default_model_path)) is first  # cached: parsing the vocab is slow
    assert first.architecture == "llama"
    # GGUF lists ne = [576, 49152]; torch order is [vocab, hidden].
    assert first.tensor_shapes["token_embd.weight"] == (49152, 576)
    assert first.tensor_shapes["blk.0.attn_k.weight"] == (192, 576)
    assert first.tensor_shapes["blk.0.ffn_down.weight"] == (576, 1536)
    assert first.metadata["tokenizer.ggml.model"] == "gpt2"
    assert first.arch_value("attention.layer_norm_rms_epsilon") == 1e-5
    assert len(first.metadata["tokenizer.ggml.tokens"]) == 49152


def test_missing_required_key_is_named(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"llama\.embedding_length missing"):
        load_gguf_config(tmp_path / "m.gguf")
