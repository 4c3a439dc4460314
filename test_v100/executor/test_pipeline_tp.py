"""Tensor x pipeline parallelism: 2 stages of 2 TP ranks each (4 processes; gloo on CPUs, NCCL on
GPUs) reproduce transformers' greedy tokens for dense, MoE and hybrid models."""
from __future__ import annotations

import pytest
import torch

from test_v100.executor.test_pipeline_parallel import check_against_transformers
from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta.model_executor.layers.pp_partition import PARTITION_ENV

# On CPUs (4 processes on few cores are slow) a dense model, and Qwen3.5-MoE: the hybrid decoder
# with MoE blocks.
@pytest.mark.parametrize("arch", ["llama", "qwen3_5_moe"])
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) tensor x pipeline parallelism")
def test_tp2_pp2_on_cpu(tmp_path, monkeypatch, arch):
    check_tp2_pp2(tmp_path, monkeypatch, arch)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "qwen3_5", "qwen3_5_moe"])
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs")
def test_tp2_pp2_on_gpus(tmp_path, monkeypatch, arch):
    check_tp2_pp2(tmp_path, monkeypatch, arch, dtype="float32", gpu_memory_utilization=0.2)


def check_tp2_pp2(tmp_path, monkeypatch, arch, **engine_kwargs):
    """Ranks 0-1 hold stage 0, ranks 2-3 stage 1 (4 heads, 2 KV heads: one KV head per TP rank);
    rank 2 samples. Llama's 3 layers split 2 + 1."""
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    hf_model = save_tiny_model(tmp_path, arch, seed=4, **({"num_hidden_layers": 3} if arch == "llama" else {}))
    check_against_transformers(tmp_path, hf_model, random_prompts(2, 3, 16, seed=5),
                               tensor_parallel_size=2, pipeline_parallel_size=2, **engine_kwargs)
