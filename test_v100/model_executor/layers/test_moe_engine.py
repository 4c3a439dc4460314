"""MoE models in the engine as users run them on a GPU: float16, CUDA graphs for decode steps and
piecewise graphs for prompts (the MoE layers' routing and experts captured: decode GEMVs and the
grouped GEMM), every logprob within float16 noise of transformers' float32 on the same tokens."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models.hf_compare import check_engine_logprobs, save_random_hf_model

SHAPE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=120,
             max_position_embeddings=256, rms_norm_eps=1e-5)
CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(**SHAPE, intermediate_size=192, num_local_experts=8,
                                                  num_experts_per_tok=2),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**SHAPE, head_dim=64, intermediate_size=192, num_experts=16,
                                                     num_experts_per_tok=4, moe_intermediate_size=96,
                                                     norm_topk_prob=True),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_engine_with_cuda_graphs_matches_transformers(arch, tmp_path):
    hf = save_random_hf_model(CONFIGS[arch](), tmp_path)
    check_engine_logprobs(tmp_path, hf)  # asserts the decode graphs were captured
