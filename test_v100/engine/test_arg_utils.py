from __future__ import annotations

import argparse

import pytest
import torch

from test_v100.worker.tiny_models import tiny_model_dir
from vllm_volta.engine.arg_utils import EngineArgs, default_batch_limits


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory, "llama")


def test_create_engine_config_defaults(model_dir):
    cfg = EngineArgs(model=str(model_dir)).create_engine_config()
    sc, cc, mc = cfg.scheduler_config, cfg.cache_config, cfg.model_config
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert cfg.device_config.device == device
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == default_batch_limits(device)
    if device == "cpu":
        assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (128, 2048)
    assert sc.max_model_len == mc.max_model_len == 512 and sc.enable_chunked_prefill
    assert cc.block_size == 16 and cc.enable_prefix_caching and cc.gpu_memory_utilization == 0.9
    assert mc.seed == 0 and not mc.enforce_eager


class _FakeGpu:
    def __init__(self, name, gib):
        self.name, self.bytes = name, int(gib * 1024**3)

    def get_device_name(self, device_id=0):
        return self.name

    def get_device_total_memory(self, device_id=0):
        return self.bytes


@pytest.mark.parametrize("name,gib,expected", [
    ("Tesla V100-SXM2-16GB", 15.77, (256, 8192)),
    ("Tesla V100-SXM2-32GB", 31.7, (256, 8192)),
    ("Tesla T4", 14.6, (256, 8192)),
    ("NVIDIA A100-SXM4-80GB", 79.2, (256, 8192)),  # vLLM: the larger budget is slower there
    ("NVIDIA H100 80GB HBM3", 79.1, (1024, 16384)),
    ("NVIDIA H200", 139.8, (1024, 16384)),
])
def test_gpu_batch_defaults_follow_vllm(monkeypatch, name, gib, expected):
    import vllm_volta.platforms as platforms
    monkeypatch.setattr(platforms, "current_platform", _FakeGpu(name, gib), raising=False)
    assert default_batch_limits("cuda") == expected
    assert default_batch_limits("cpu") == (128, 2048)


def test_explicit_values_flow_through(model_dir):
    cfg = EngineArgs(model=str(model_dir), max_model_len=128, max_num_seqs=3,
                     max_num_batched_tokens=64, block_size=8, enable_prefix_caching=False,
                     enforce_eager=True, seed=7, dtype="half", cpu_kvcache_space=0.5,
                     num_gpu_blocks_override=10, served_model_name="tiny").create_engine_config()
    assert (cfg.scheduler_config.max_num_seqs, cfg.scheduler_config.max_num_batched_tokens,
            cfg.scheduler_config.max_model_len) == (3, 64, 128)
    assert (cfg.cache_config.block_size, cfg.cache_config.enable_prefix_caching,
            cfg.cache_config.num_gpu_blocks_override) == (8, False, 10)
    mc = cfg.model_config
    assert (mc.enforce_eager, mc.seed, mc.dtype, mc.served_model_name) == (
        True, 7, torch.float16, "tiny")


def test_no_chunked_prefill_budget_covers_max_model_len(model_dir):
    cfg = EngineArgs(model=str(model_dir), enable_chunked_prefill=False,
                     max_num_batched_tokens=None).create_engine_config()
    assert cfg.scheduler_config.max_num_batched_tokens >= 512


def test_parallel_errors(model_dir):
    # The model does not exist: the parallel check must fire first.
    with pytest.raises(ValueError, match="pipeline_parallel_size must be an integer >= 1, got 0"):
        EngineArgs(model="/does/not/exist", pipeline_parallel_size=0).create_engine_config()
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=9 is more than the model's \d+ decoder"):
        EngineArgs(model=str(model_dir), pipeline_parallel_size=9, device="cpu").create_engine_config()
    with pytest.raises(ValueError, match="async_scheduling cannot be combined with pipeline_parallel_size=2"):
        EngineArgs(model=str(model_dir), pipeline_parallel_size=2, async_scheduling=True,
                   device="cpu").create_engine_config()
    assert EngineArgs(model=str(model_dir), pipeline_parallel_size=2, tensor_parallel_size=2,
                      device="cpu").create_engine_config().parallel_config.world_size == 4
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the model's 4 "):
        EngineArgs(model=str(model_dir), tensor_parallel_size=3).create_engine_config()
    assert EngineArgs(model=str(model_dir), tensor_parallel_size=2,
                      device="cpu").create_engine_config().parallel_config.world_size == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_more_ranks_than_gpus_is_a_clear_error(model_dir):
    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match=f"tensor_parallel_size={too_many} needs {too_many} GPUs"):
        EngineArgs(model=str(model_dir), tensor_parallel_size=too_many).create_engine_config()


def test_cli_round_trip(model_dir):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", str(model_dir), "--max-model-len", "64",
                              "--no-enable-prefix-caching", "--enforce-eager",
                              "--gpu-memory-utilization", "0.5", "--cuda-graph-sizes", "1", "2",
                              "--tensor-parallel-size", "1"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args == EngineArgs(model=str(model_dir), max_model_len=64,
                                     enable_prefix_caching=False, enforce_eager=True,
                                     gpu_memory_utilization=0.5, cuda_graph_sizes=[1, 2])
    defaults = EngineArgs.from_cli_args(parser.parse_args([]))
    assert defaults == EngineArgs()
    positional = EngineArgs.add_cli_args(argparse.ArgumentParser(), include_model=False)
    assert "model" not in vars(positional.parse_args([]))
