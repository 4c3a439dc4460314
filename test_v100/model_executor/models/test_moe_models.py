"""Mixtral and Qwen3-MoE (mixture-of-experts MLPs) vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from . import hf_compare
from .hf_compare import TINY, check_needed, hf_and_ours

CONFIGS = {
    # top-2 of 4 experts, renormalized (Mixtral always is)
    "mixtral": lambda: transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
    # top-3 of 8, not renormalized; layer 1 dense (mlp_only_layers), per-head q/k norms
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**TINY, head_dim=32, num_experts=8, num_experts_per_tok=3,
                                                     moe_intermediate_size=48, norm_topk_prob=False,
                                                     mlp_only_layers=[1]),
    # top-2 of 6 plus a shared expert and its sigmoid gate; q/k/v biases; layer 1 dense
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**TINY, num_experts=6, num_experts_per_tok=2,
                                                     moe_intermediate_size=48, shared_expert_intermediate_size=80,
                                                     decoder_sparse_step=1, mlp_only_layers=[1]),
    "qwen3_moe_renormalized": lambda: transformers.Qwen3MoeConfig(**TINY, head_dim=32, num_experts=8,
                                                                  num_experts_per_tok=3, moe_intermediate_size=48,
                                                                  norm_topk_prob=True),
}


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return hf_and_ours(CONFIGS[request.param](), folder)


def test_loaded_as_moe(models):
    hf, ours = models
    assert type(ours).__name__ == hf.config.architectures[0] and ours.supports_cuda_graphs is False
    moe = ours.model.layers[0].block_sparse_moe if hasattr(ours.model.layers[0], "block_sparse_moe") \
        else ours.model.layers[0].mlp
    assert moe.w13.shape[0] == moe.num_experts and moe.gate.weight.shape[0] == moe.num_experts
    if getattr(hf.config, "mlp_only_layers", None):
        assert type(ours.model.layers[1].mlp).__name__ == "LlamaMLP"


def test_routing_matters(models):
    """Routing every token to the same experts breaks the match: the experts are really chosen
    per token."""
    hf, ours = models
    moe = ours.model.layers[0].block_sparse_moe if hasattr(ours.model.layers[0], "block_sparse_moe") \
        else ours.model.layers[0].mlp
    check_needed(ours, hf, [(moe.gate.weight, "data", torch.zeros_like(moe.gate.weight))])
