from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.worker.tiny_models import tiny_config, tiny_model_dir
from vllm_volta.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,
                               SchedulerConfig, VllmConfig, derive_max_model_len)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory, "qwen3")


def test_model_config_resolves_from_a_folder(model_dir):
    mc = ModelConfig(model=str(model_dir))
    assert isinstance(mc.hf_config, transformers.Qwen3Config)
    assert mc.model_path == str(model_dir.resolve())
    assert mc.max_model_len == 512  # max_position_embeddings
    assert mc.served_model_name == str(model_dir)
    assert (mc.get_num_layers(), mc.get_num_kv_heads(), mc.get_head_size(), mc.get_vocab_size()) \
        == (2, 2, 32, 384)
    assert mc.architectures == ["Qwen3ForCausalLM"]
    assert mc.tokenizer_source == mc.model_path


def test_dtype_through_the_platform(model_dir):
    assert ModelConfig(model=str(model_dir), dtype="half").dtype == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(model=str(model_dir), dtype="int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU default dtype")
def test_cpu_auto_dtype_is_float32(model_dir):
    assert ModelConfig(model=str(model_dir), dtype="auto").dtype == torch.float32


def test_max_model_len_validation(model_dir):
    assert ModelConfig(model=str(model_dir), max_model_len=100).max_model_len == 100
    with pytest.raises(ValueError, match=r"max_model_len=1000 is larger than the model supports "
                                         r"\(512.*\[1, 512\]"):
        ModelConfig(model=str(model_dir), max_model_len=1000)
    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig(model=str(model_dir), max_model_len=0)


def test_given_hf_config_and_bad_fields():
    cfg = tiny_config("llama")
    mc = ModelConfig(model="tiny", hf_config=cfg, dtype="float32")
    assert mc.model_path == "tiny" and mc.get_head_size() == 16
    with pytest.raises(ValueError, match="load_format"):
        ModelConfig(model="tiny", hf_config=cfg, load_format="pickle")
    with pytest.raises(ValueError, match="does not exist"):
        ModelConfig(model="/no/such/model/dir")


def test_quantization_flag_is_checked_against_the_checkpoint():
    dense = tiny_config("llama")
    assert ModelConfig(model="tiny", hf_config=dense, dtype="float32").quantization is None
    with pytest.raises(ValueError, match="quantization='awq', but the checkpoint is not quantized"):
        ModelConfig(model="tiny", hf_config=dense, dtype="float32", quantization="awq")
    awq = tiny_config("llama")
    awq.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 16}
    for flag in (None, "awq", "AWQ_Marlin"):
        ModelConfig(model="tiny", hf_config=awq, dtype="float32", quantization=flag)
    with pytest.raises(ValueError, match="quantization='gptq', but the checkpoint is awq-quantized"):
        ModelConfig(model="tiny", hf_config=awq, dtype="float32", quantization="gptq")
    with pytest.raises(ValueError, match="quantization must be one of"):
        ModelConfig(model="tiny", hf_config=awq, dtype="float32", quantization="bitsandbytes")
    awq.quantization_config = {"quant_method": "bitsandbytes"}  # refused before any weight loads
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not supported; supported: awq, gptq"):
        ModelConfig(model="tiny", hf_config=awq, dtype="float32")


def test_derive_max_model_len_rope_scaling():
    cfg = tiny_config("llama")
    assert derive_max_model_len(cfg) == 512
    cfg.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}
    assert derive_max_model_len(cfg) == 2048
    cfg.rope_parameters = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4,
                           "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0}
    assert derive_max_model_len(cfg) == 512  # llama3 configs already state the long length


@pytest.mark.parametrize("kwargs, field", [
    ({"block_size": 0}, "block_size"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"cpu_kvcache_space": -1}, "cpu_kvcache_space"),
    ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),
])
def test_cache_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CacheConfig(**kwargs)


def test_cache_config_cpu_budget(monkeypatch):
    assert CacheConfig(cpu_kvcache_space=0.5).cpu_kvcache_bytes() == 1 << 29
    monkeypatch.setenv("VLLM_VOLTA_CPU_KVCACHE_SPACE", "2")
    assert CacheConfig().cpu_kvcache_bytes() == 2 << 30


def test_scheduler_config_validation():
    SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=1, max_model_len=64)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=100, max_model_len=200,
                        enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        SchedulerConfig(cuda_graph_sizes=[1, 0])


def test_parallel_and_device_config():
    assert ParallelConfig().world_size == 1
    assert ParallelConfig(tensor_parallel_size=2).world_size == 2
    assert ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2).world_size == 4
    assert ParallelConfig(pipeline_parallel_size=2, distributed_executor_backend="ray").world_size == 2
    with pytest.raises(ValueError, match="pipeline_parallel_size=2 needs 'mp' or 'ray'"):
        ParallelConfig(pipeline_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        ParallelConfig(pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        ParallelConfig(tensor_parallel_size=0)
    assert DeviceConfig().device == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device"):
        DeviceConfig("tpu")


def test_vllm_config_applies_platform_rules():
    mc = ModelConfig(model="tiny", hf_config=tiny_config("llama"), dtype="float32")
    config = VllmConfig(model_config=mc)
    assert config.cache_config.block_size == 16
    if not torch.cuda.is_available():
        assert config.cache_config.cpu_kvcache_space is not None  # filled from the env


def test_generation_config_defaults(tmp_path):
    import json
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
         "max_new_tokens": 512, "do_sample": True, "eos_token_id": [1, 2], "min_p": None}))
    mc = ModelConfig(model="tiny", hf_config=tiny_config("llama"), dtype="float32",
                     model_path=str(tmp_path))
    assert mc.get_diff_sampling_param() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                            "repetition_penalty": 1.05, "max_tokens": 512}
    mc.generation_config = "vllm"
    assert mc.get_diff_sampling_param() == {}
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text('{"temperature": 0.1}')
    assert ModelConfig(model="tiny", hf_config=tiny_config("llama"), dtype="float32",
                       generation_config=str(other)).get_diff_sampling_param() == {"temperature": 0.1}
    with pytest.raises(ValueError, match="generation_config must be 'auto', 'vllm' or a folder"):
        ModelConfig(model="tiny", hf_config=tiny_config("llama"), dtype="float32",
                    generation_config="nope")


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_gemma2_and_3_are_not_auto_float16(clean_env, model_type, capsys):
    """Where bfloat16 is missing (Volta), "auto" runs Gemma 2 / 3 in float32, not float16 (their
    activations overflow it); an explicit float16 is honoured with a warning."""
    cfg = tiny_config("gemma2" if model_type == "gemma2" else "gemma3")
    cfg.torch_dtype = torch.bfloat16
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    from vllm_volta.platforms import cuda

    monkey = pytest.MonkeyPatch()
    monkey.setattr("vllm_volta.platforms.current_platform", cuda.CudaPlatform(), raising=False)
    try:
        assert ModelConfig(model="tiny", hf_config=cfg).dtype == torch.float32
        assert ModelConfig(model="tiny", hf_config=cfg, dtype="half").dtype == torch.float16
        logged = capsys.readouterr().out
        assert "running float32" in logged and "can overflow" in logged
        llama = tiny_config("llama")
        llama.torch_dtype = torch.bfloat16
        assert ModelConfig(model="tiny", hf_config=llama).dtype == torch.float16
    finally:
        monkey.undo()
