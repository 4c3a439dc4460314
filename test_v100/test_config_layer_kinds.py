"""Models whose layers differ: linear-attention layers with a recurrent state (state slots, no
prefix caching) and per-layer head sizes."""
from __future__ import annotations

import transformers

from vllm_volta.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig


def tiny(config_cls):
    return config_cls(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=256)


def test_hybrid_models_get_state_slots_and_no_prefix_caching():
    for cfg in (tiny(transformers.Qwen3_5TextConfig), tiny(transformers.Qwen3NextConfig)):
        mc = ModelConfig(model="tiny", hf_config=cfg, dtype="float32")
        assert mc.has_recurrent_state
        vc = VllmConfig(mc, CacheConfig(enable_prefix_caching=True), SchedulerConfig(max_num_seqs=6))
        assert vc.cache_config.num_state_slots == 7 and not vc.cache_config.enable_prefix_caching


def test_other_models_keep_prefix_caching_and_no_slots():
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   vocab_size=100, max_position_embeddings=256)
    mc = ModelConfig(model="tiny", hf_config=cfg, dtype="float32")
    vc = VllmConfig(mc, CacheConfig(enable_prefix_caching=True))
    assert not mc.has_recurrent_state
    assert vc.cache_config.num_state_slots == 0 and vc.cache_config.enable_prefix_caching


def test_per_layer_head_sizes_are_read_per_layer():
    cfg = transformers.Gemma4TextConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=100, head_dim=16,
                                        global_head_dim=32, max_position_embeddings=256)
    mc = ModelConfig(model="tiny", hf_config=cfg, dtype="float32")
    assert mc.get_head_size() == max(layer.head_dim for layer in cfg.per_layer_config) == 32
    assert mc.get_num_kv_heads() == max(layer.num_key_value_heads for layer in cfg.per_layer_config)
